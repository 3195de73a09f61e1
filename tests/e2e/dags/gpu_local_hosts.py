"""Local-runner tasks whose replicas say when they run: a gang of two replicas with
GANG_GPUS GPUs each (4: one replica on each host of the e2e cluster; 2: both fit one
host), and a GpuBashOperator and a @task.gpu task of one GPU each."""

import os

from airflow.sdk import DAG, task

from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.operators.gang import GpuGangOperator

SAY = 'echo "RAN $AIRFLOW_GPU_ROLE-$AIRFLOW_GPU_REPLICA on $AIRFLOW_GPU_HOST"'

with DAG("gpu_local_gang", schedule=None, catchup=False) as gang:
    GpuGangOperator(task_id="gang", runner="local", command=SAY, poll_interval=0.5,
                    roles=[{"name": "worker", "replicas": 2, "cpus": 1, "memory": "64MiB",
                            "gpus": int(os.environ.get("GANG_GPUS", "4"))}])

with DAG("gpu_local_single", schedule=None, catchup=False) as single:
    GpuBashOperator(task_id="bash", bash_command=SAY, gpus=1, cpus=1, memory="64MiB",
                    poll_interval=0.5)

    @task.gpu(gpus=1, cpus=1, memory="64MiB", poll_interval=0.5)
    def python():
        print("RAN python")

    python()
