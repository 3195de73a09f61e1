"""Two chained GPU tasks of a DAG with a DeadlineAlert (queued_at + DEADLINE_S seconds):
`train` (3 GPUs, planned 30m) sends the deadline and `validate`'s 1h30m as its downstream work.
GPU_WAIT_TIMEOUT sets train's admission_timeout."""

import os
from datetime import timedelta

from airflow.sdk import DAG, DeadlineAlert, DeadlineReference, SyncCallback

from airflow_gpu.operators.bash import GpuBashOperator

TIMEOUT = os.environ.get("GPU_WAIT_TIMEOUT")

with DAG("gpu_deadline", schedule=None, catchup=False,
         deadline=DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT,
                                interval=timedelta(seconds=int(os.environ["DEADLINE_S"])),
                                callback=SyncCallback("builtins.print"))) as dag:
    train = GpuBashOperator(task_id="train", gpus=3, cpus=1, memory="64MiB",
                            bash_command="true", expected_runtime="30m",
                            poll_interval=0.3, admission_grace=0.2,
                            admission_timeout=float(TIMEOUT) if TIMEOUT else None)
    validate = GpuBashOperator(task_id="validate", gpus=2, cpus=1, memory="64MiB",
                               bash_command="true", expected_runtime="1h30m",
                               poll_interval=0.3, admission_grace=0.2)
    train >> validate
