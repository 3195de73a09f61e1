"""A GPU task whose instance should carry a "GPU job" link (CPU-only, so it takes no GPU
from the demo state the page tests read)."""

from airflow.sdk import DAG

from airflow_gpu.operators.bash import GpuBashOperator

with DAG("gpu_link", schedule=None, catchup=False) as dag:
    GpuBashOperator(task_id="evaluate", bash_command="true", gpus=0, cpus=1,
                    memory="64MiB", job_class="etl", poll_interval=0.5)
