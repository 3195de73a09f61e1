"""Job classes: defaults and checks applied to a job spec. The built-ins are a plugin.

A class fills only what the spec leaves unset: a user's explicit value wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InputError
from .jobspec import MEMORY_PER_CPU, MEMORY_PER_GPU, JobSpec
from .plugins import hookimpl


@dataclass(frozen=True)
class JobClass:
    name: str
    description: str
    placement: dict[str, Any] = field(default_factory=dict)   # Placement defaults
    role_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)  # by role name
    priority_weight: int = 0
    default_runtime: int | None = None   # seconds
    max_gpus: int | None = None          # per job
    gpu_roles: bool = True               # may roles ask for GPUs?
    # Operators may take a job's expected runtime from its task's last successful runs
    # (class default otherwise); off for classes whose runs vary too much to predict.
    runtime_from_history: bool = True
    # When a GPU the job holds turns unhealthy: requeue the whole gang (same job id, back
    # to pending), cancel it, or keep it running (it is flagged either way).
    on_gpu_failure: Literal["requeue", "cancel", "keep"] = "requeue"
    # host memory a replica books when its role gives none (else the policy's defaults)
    memory_per_gpu: int | None = None
    memory_per_cpu: int | None = None

    def check(self, spec: JobSpec) -> list[str]:
        problems = []
        if not self.gpu_roles and spec.total_gpus:
            problems.append(f"job class {self.name!r} is CPU-only but the job asks for "
                            f"{spec.total_gpus} GPUs; set gpus: 0 or use another class")
        if self.max_gpus is not None and spec.total_gpus > self.max_gpus:
            problems.append(f"job class {self.name!r} allows at most {self.max_gpus} GPUs per "
                            f"job, the job asks for {spec.total_gpus}; use class 'pytorch' "
                            "or 'tensorflow-ps' for larger jobs")
        return problems

    def apply(self, spec: JobSpec) -> JobSpec:
        placement = spec.placement.model_copy(update={
            k: v for k, v in self.placement.items() if k not in spec.placement.model_fields_set})
        roles = []
        for role in spec.roles:
            defaults = self.role_defaults.get(role.name, {})
            roles.append(role.model_copy(update={
                k: v for k, v in defaults.items() if k not in role.model_fields_set}))
        update: dict[str, Any] = {"placement": placement, "roles": roles}
        if spec.expected_runtime is None and self.default_runtime is not None:
            update["expected_runtime"] = self.default_runtime
        return spec.model_copy(update=update)


BUILTIN = [
    JobClass("pytorch", "distributed PyTorch (DDP/NCCL): GPU workers packed on as few hosts "
             "as possible, cores and memory strictly NUMA-local, NICs behind the GPUs",
             placement={"pack": True, "affinity": "strict", "nics": True},
             priority_weight=0, default_runtime=6 * 3600),
    JobClass("tensorflow-ps", "TensorFlow parameter-server training: workers packed, "
             "parameter servers placed on the workers' hosts or switch",
             placement={"pack": True, "affinity": "strict", "nics": True, "locality": "switch"},
             role_defaults={"ps": {"cpus": 1, "memory": 8 * 2**30}},
             priority_weight=0, default_runtime=6 * 3600),
    JobClass("etl", "CPU-only data preparation, any locality",
             placement={"pack": False, "affinity": "none", "nics": False, "locality": "any"},
             priority_weight=0, default_runtime=3600, gpu_roles=False, on_gpu_failure="keep"),
    JobClass("validation", "small GPU jobs (evaluation, tests) on one host",
             placement={"pack": True, "affinity": "preferred", "locality": "host"},
             priority_weight=10, default_runtime=1800, max_gpus=8,
             # short runs on a suspect GPU: end them; the Airflow task's retries decide
             on_gpu_failure="cancel"),
]


@hookimpl
def airflow_gpu_job_classes() -> list[JobClass]:
    return BUILTIN


def resolve(spec: JobSpec, classes: dict[str, JobClass], source: str | None = None,
            memory: tuple[int, int] = (MEMORY_PER_GPU, MEMORY_PER_CPU)) -> JobSpec:
    """The spec with its class applied and every role's memory booked (the class's per GPU
    and per CPU, else `memory`: the policy's); an unknown class or a broken class rule is
    an error."""
    jc = None
    if spec.job_class is not None:
        jc = classes.get(spec.job_class)
        if jc is None:
            raise InputError(f"job {spec.name!r}: job_class: unknown class "
                             f"{spec.job_class!r}; known classes: {', '.join(sorted(classes))}",
                             source)
        problems = jc.check(spec)
        if problems:
            raise InputError(f"job {spec.name!r}: job_class: " + "; ".join(problems), source)
        spec = jc.apply(spec)
    if all(r.memory is not None for r in spec.roles):
        return spec
    per_gpu = jc.memory_per_gpu if jc and jc.memory_per_gpu is not None else memory[0]
    per_cpu = jc.memory_per_cpu if jc and jc.memory_per_cpu is not None else memory[1]
    return spec.model_copy(update={"roles": [
        r if r.memory is not None else r.model_copy(update={
            "memory": r.booked_memory(per_gpu, per_cpu)}) for r in spec.roles]})
