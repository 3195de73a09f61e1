"""ETL (CPU) -> distributed training (TensorFlow 2 ps + 10 workers, and a PyTorch variant)
-> validation (1 GPU), with GPUs, cores, NUMA memory and NICs chosen by the scheduler.

Nothing here names a host or a GPU index. Each task asks for what it needs; the
scheduler-core (connection `gpu_scheduler_default`) decides where and when, and the task
waits deferred, without a worker slot, until its GPUs are free.

AIRFLOW_GPU_EXAMPLE_RUNNER=local runs every replica as a local process instead of a
container (what `make demo` does on a machine without GPUs or Docker), and
AIRFLOW_GPU_EXAMPLE_WORK replaces the training commands (e.g. with `sleep 1`).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_gpu.operators.gang import GpuGangOperator

RUNNER = os.environ.get("AIRFLOW_GPU_EXAMPLE_RUNNER", "docker")
WORK = os.environ.get("AIRFLOW_GPU_EXAMPLE_WORK")
# Every replica says what it was given (the launcher sets these variables).
SHOW = ('echo "$AIRFLOW_GPU_ROLE-$AIRFLOW_GPU_REPLICA on $AIRFLOW_GPU_HOST: '
        'GPUs [$AIRFLOW_GPU_GPUS] CPUs $AIRFLOW_GPU_CPUS NUMA $AIRFLOW_GPU_NUMA_NODES '
        'NICs ${NCCL_IB_HCA:--}"')


def run(command: str) -> list[str]:
    return ["sh", "-c", f"{SHOW}; {WORK or command}"] if RUNNER == "docker" else \
        f"{SHOW}; {WORK or command}"


with DAG(
    dag_id="gpu_training_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["gpu", "example"],
    default_args={"runner": RUNNER, "team": "vision", "poll_interval": 2.0},
) as dag:
    etl = GpuGangOperator(
        task_id="etl", job_class="etl", cpus=8, memory="32GiB",
        image="python:3.12-slim", command=run("python -m etl --out /data/imagenet-shards"))

    # The product brief: 2 parameter servers (1 CPU, 8 GB) + 10 workers, each a GPU with
    # at least 48 GB and 5 GB of host memory, cores and memory NUMA-local to the GPU,
    # packed on few hosts under one switch.
    train_tf = GpuGangOperator(
        task_id="train_tensorflow", job_class="tensorflow-ps", priority=50,
        expected_runtime="6h", image="nvcr.io/nvidia/tensorflow:24.05-tf2-py3",
        command=run("python train.py --data /data/imagenet-shards"),
        roles=[{"name": "ps", "replicas": 2, "cpus": 1, "memory": "8GiB"},
               {"name": "worker", "replicas": 10, "gpus": 1,
                "gpu": {"min_memory": "48GiB"}, "cpus": 4, "memory": "5GiB"}],
        placement={"locality": "switch", "affinity": "strict"})

    # The same model with PyTorch DDP: 2 hosts x 4 GPUs, torchrun's variables set.
    train_torch = GpuGangOperator(
        task_id="train_pytorch", job_class="pytorch", priority=40, expected_runtime="4h",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        command=run("torchrun --nnodes=$WORLD_SIZE --node-rank=$RANK "
                    "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py"),
        roles=[{"name": "worker", "replicas": 2, "gpus": 4, "cpus": 16, "memory": "64GiB"}])

    validate = GpuGangOperator(
        task_id="validate", job_class="validation", gpus=1, cpus=4, memory="16GiB",
        image="nvcr.io/nvidia/pytorch:24.05-py3", command=run("python validate.py"))

    etl >> [train_tf, train_torch] >> validate
