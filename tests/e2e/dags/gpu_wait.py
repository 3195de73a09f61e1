"""A GpuBashOperator task that asks for more than the cluster has free (the test holds
every GPU), so it waits in its trigger; GPU_WAIT_TIMEOUT sets its admission_timeout."""

import os

from airflow.sdk import DAG

from airflow_gpu.operators.bash import GpuBashOperator

TIMEOUT = os.environ.get("GPU_WAIT_TIMEOUT")

with DAG("gpu_wait", schedule=None, catchup=False) as dag:
    GpuBashOperator(task_id="wait", gpus=1, cpus=1, memory="64MiB", bash_command="true",
                    poll_interval=0.5, admission_grace=0.2,
                    admission_timeout=float(TIMEOUT) if TIMEOUT else None)
