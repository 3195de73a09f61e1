"""A TensorFlow parameter-server gang: 2 ps + 4 workers (2 GPUs each) as one task."""

import os

from airflow.sdk import DAG

from airflow_gpu.operators.gang import GpuGangOperator

SHOW = ('echo "TF_CONFIG=$TF_CONFIG"; '
        "if [ \"$AIRFLOW_GPU_ROLE-$AIRFLOW_GPU_REPLICA\" = \"worker-$FAIL_WORKER\" ]; then "
        "echo 'loss is NaN, giving up' >&2; exit 3; fi; "
        "trap 'exit 143' TERM; sleep ${RUN_FOR:-0} & wait $!")

with DAG("gpu_gang", schedule=None, catchup=False) as dag:
    GpuGangOperator(
        task_id="train", job_class="tensorflow-ps", image="airflow-gpu-test/busybox:1",
        command=["sh", "-c", SHOW], network_mode="none", poll_interval=0.5, gpu_mode="env",
        environment={"FAIL_WORKER": os.environ.get("FAIL_WORKER", ""),
                     "RUN_FOR": os.environ.get("RUN_FOR", "0")},
        roles=[{"name": "ps", "replicas": 2, "cpus": 1, "memory": "128MiB"},
               {"name": "worker", "replicas": 4, "gpus": 2, "cpus": 1, "memory": "128MiB"}])
