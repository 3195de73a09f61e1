"""A GpuBashOperator task that would run for a minute under a 3-second time limit; on
SIGTERM it takes a second to save its "checkpoint", then exits by itself."""

from airflow.sdk import DAG

from airflow_gpu.operators.bash import GpuBashOperator

with DAG("gpu_limit_local", schedule=None, catchup=False) as dag:
    GpuBashOperator(task_id="long", gpus=1, cpus=1, memory="64MiB", time_limit="3s",
                    bash_command="trap 'echo saving a checkpoint; sleep 1; "
                                 "echo checkpoint saved; exit 143' TERM; "
                                 "echo working; sleep 60 & wait $!",
                    poll_interval=0.5)
