"""The local runner: a GpuBashOperator and a @task.gpu callable, each probing what it got."""

import sys
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_gpu.operators.bash import GpuBashOperator

PROBE = Path(__file__).resolve().parents[1] / "probe.py"

with DAG("gpu_local", schedule=None, catchup=False) as dag:
    bash = GpuBashOperator(task_id="bash_probe", bash_command=f"{sys.executable} {PROBE}",
                           gpus=2, cpus=1, memory="128MiB", job_class="validation",
                           poll_interval=0.5, strict_isolation=True)

    @task.gpu(gpus=1, cpus=1, memory="96MiB", poll_interval=0.5, strict_isolation=True)
    def python_probe():
        import json

        from tests.e2e.probe import probe

        found = probe()
        print("PROBE-PY " + json.dumps(found))
        return {"affinity": found["affinity"]}

    bash >> python_probe()
