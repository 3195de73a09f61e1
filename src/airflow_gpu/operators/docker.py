"""A GPU task as one container on the admitted host's Docker engine."""

from __future__ import annotations

from .gang import GpuGangOperator


class GpuDockerOperator(GpuGangOperator):
    """Runs `image` with `command` on the GPUs, cores, NUMA memory and NIC the scheduler
    grants: ``GpuDockerOperator(task_id="train", image="nvcr.io/nvidia/pytorch:24.05-py3",
    command="python train.py", gpus=4, cpus=16, memory="64GiB", job_class="pytorch")``.
    See GpuGangOperator and GpuBaseOperator for the other arguments."""

    def __init__(self, *, image: str, command: str | list[str] | None = None,
                 **kwargs) -> None:
        super().__init__(image=image, command=command, runner="docker", **kwargs)
