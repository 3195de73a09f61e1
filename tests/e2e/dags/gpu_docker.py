"""One GpuDockerOperator task; the test sets what it asks for through the environment."""

import os

from airflow.sdk import DAG

from airflow_gpu.operators.docker import GpuDockerOperator

# A well-behaved container: it ends on SIGTERM (docker stop) at once.
PROBE = ("trap 'exit 143' TERM; "
         "echo cpuset.cpus=$(cat /sys/fs/cgroup/cpuset/cpuset.cpus); "
         "echo cpuset.mems=$(cat /sys/fs/cgroup/cpuset/cpuset.mems); "
         "echo memory.limit=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes); "
         "env | sort | grep -E '^(NVIDIA_VISIBLE_DEVICES|AIRFLOW_GPU_|NCCL_IB_HCA)'; "
         "if [ -n \"$PROBE_WAIT\" ]; then while [ ! -e $PROBE_WAIT ]; do sleep 0.2; done; fi; "
         "sleep ${PROBE_SLEEP:-0} & wait $!; exit ${PROBE_EXIT:-0}")
MOUNT = os.environ.get("TEST_MOUNT")    # host_dir:container_dir, for PROBE_WAIT files

with DAG("gpu_docker", schedule=None, catchup=False) as dag:
    GpuDockerOperator(
        task_id="probe", image="airflow-gpu-test/busybox:1", command=["sh", "-c", PROBE],
        gpus=int(os.environ.get("TEST_GPUS", "2")), cpus=1,
        memory=os.environ.get("TEST_MEMORY", "256MiB") or None,
        gpu_mode=os.environ.get("TEST_GPU_MODE", "env"), network_mode="none",
        environment={k: os.environ.get(k, "") for k in ("PROBE_SLEEP", "PROBE_EXIT",
                                                         "PROBE_WAIT")},
        mounts=[MOUNT] if MOUNT else [],
        job_class=os.environ.get("TEST_JOB_CLASS", "validation"), poll_interval=0.5,
        time_limit=os.environ.get("TEST_TIME_LIMIT") or None,
        admission_grace=float(os.environ.get("TEST_GRACE", "1")))
