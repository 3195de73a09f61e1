"""One GpuDockerOperator task whose container checkpoints on SIGTERM: it prints what it
was granted and whether it is a restarted attempt, runs until a file appears (or for ever),
and on SIGTERM writes a checkpoint line, takes a second and exits."""

import os

from airflow.sdk import DAG

from airflow_gpu.operators.docker import GpuDockerOperator

TRAINER = ("trap 'echo checkpoint saved at step $i; sleep 1; exit 143' TERM; "
           "env | sort | grep -E '^AIRFLOW_GPU_(HOST|GPUS|ATTEMPT|RESTARTED|REQUEUE_REASON)='; "
           "i=0; while [ ! -e /signal/$DONE_FILE ]; do i=$((i+1)); sleep 0.2 & wait $!; done; "
           "echo done after step $i")

with DAG("gpu_preempt", schedule=None, catchup=False) as dag:
    GpuDockerOperator(
        task_id="train", image="airflow-gpu-test/busybox:1", command=["sh", "-c", TRAINER],
        gpus=4, cpus=1, memory="256MiB", network_mode="none", gpu_mode="env",
        priority=int(os.environ["TEST_PRIORITY"]), job_class="pytorch",
        expected_runtime="1h", environment={"DONE_FILE": os.environ["DONE_FILE"]},
        mounts=[os.environ["TEST_MOUNT"]], poll_interval=0.5, admission_grace=1.0)
