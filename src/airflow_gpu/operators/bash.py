"""A GPU task as a local process (a single DGX host with LocalExecutor)."""

from __future__ import annotations

from .gang import GpuGangOperator


class GpuBashOperator(GpuGangOperator):
    """Runs `bash_command` on this machine with CUDA_VISIBLE_DEVICES set to the granted
    GPUs, CPU affinity to the granted cores and a cgroup with the cpuset, NUMA memory
    nodes and memory limit: ``GpuBashOperator(task_id="eval", bash_command="python
    eval.py", gpus=1, job_class="validation")``. The command is templated. A grant on
    another host than this machine (`[gpu_scheduler] local_host`) fails the task."""

    def __init__(self, *, bash_command: str, **kwargs) -> None:
        super().__init__(command=bash_command, runner="local", **kwargs)
