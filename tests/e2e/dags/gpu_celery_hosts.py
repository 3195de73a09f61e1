"""Tasks routed by Celery queue, one queue per DGX host (dgx-01..03): each local-runner
replica prints the host it was granted and the worker that started it. Two tasks share
dgx-03 (4 GPUs) so that one waits deferred and resumes there; `unrouted` has no queue
and lands on the general worker, which is no cluster host; `in_container` runs there
too, on its granted host's Docker engine."""

from airflow.sdk import DAG

from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.operators.docker import GpuDockerOperator

SAY = ('echo "RAN $AIRFLOW_GPU_ROLE-$AIRFLOW_GPU_REPLICA granted $AIRFLOW_GPU_HOST '
       'worker $AIRFLOW_GPU_LOCAL_HOST"; sleep 3')
ARGS = {"bash_command": SAY, "cpus": 1, "memory": "64MiB", "poll_interval": 0.5}

with DAG("gpu_celery_hosts", schedule=None, catchup=False) as dag:
    GpuBashOperator(task_id="on_01", queue="dgx-01", gpus=1, **ARGS)
    GpuBashOperator(task_id="on_02", queue="dgx-02", gpus=2, **ARGS)
    # together more than dgx-03's 4 GPUs: one of them waits deferred, then resumes there
    GpuBashOperator(task_id="on_03_small", queue="dgx-03", gpus=2, **ARGS)
    GpuBashOperator(task_id="on_03_whole", queue="dgx-03", gpus=4, **ARGS)
    GpuBashOperator(task_id="unrouted", gpus=1, **ARGS)
    GpuDockerOperator(task_id="in_container", image="airflow-gpu-test/busybox:1",
                      command=["sh", "-c", 'echo "RAN in a container on $AIRFLOW_GPU_HOST"'],
                      gpus=1, cpus=1, memory="64MiB", network_mode="none", gpu_mode="env",
                      poll_interval=0.5)
