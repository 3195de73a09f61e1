"""Local-runner tasks whose replicas say when they run: a gang of two replicas with
GANG_GPUS GPUs each (4: one replica on each host of the e2e cluster; 2: both fit one
host), a GpuBashOperator and a @task.gpu task of one GPU each; the same gang with the
Docker runner (the route for a gang across hosts); and a GpuBashOperator and a @task.gpu
task that try to open every GPU device node in $DEVICE_DIR (made with mknod)."""

import errno
import inspect
import os
import sys

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

with DAG("gpu_docker_gang", schedule=None, catchup=False) as docker_gang:
    GpuGangOperator(task_id="gang", runner="docker", image="airflow-gpu-test/busybox:1",
                    command=["sh", "-c", SAY], network_mode="none", gpu_mode="env",
                    poll_interval=0.5,
                    roles=[{"name": "worker", "replicas": 2, "cpus": 1, "memory": "64MiB",
                            "gpus": 4}])


def open_nodes(who: str, where: str = "") -> None:
    """Open every node in `where` (default $DEVICE_DIR); print `OPEN <who> <granted GPUs>
    <node> <result>`."""
    where = where or os.environ["DEVICE_DIR"]
    for name in sorted(os.listdir(where)):
        try:
            os.close(os.open(os.path.join(where, name), os.O_RDWR))
            result = "opened"
        except OSError as exc:
            result = errno.errorcode[exc.errno]
        print("OPEN", who, os.environ["AIRFLOW_GPU_GPUS"], name, result, flush=True)


with DAG("gpu_local_devices", schedule=None, catchup=False) as local_devices:
    # the command resets CUDA_VISIBLE_DEVICES, then opens every node
    GpuBashOperator(task_id="bash", bash_command='unset CUDA_VISIBLE_DEVICES; '
                    '"$PROBE_PYTHON" -c "$PROBE"', gpus=1, cpus=1, memory="64MiB",
                    poll_interval=0.5,
                    environment={"PROBE_PYTHON": sys.executable, "PROBE": "import errno, os\n"
                                 + inspect.getsource(open_nodes) + "open_nodes('bash')\n"})

    @task.gpu(gpus=1, cpus=1, memory="64MiB", poll_interval=0.5)
    def python(where: str):
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
        open_nodes("python", where)

    python(os.environ.get("DEVICE_DIR", ""))
