"""Job classes: defaults and checks applied to a job spec. The built-ins are a plugin.

A class fills only what the spec leaves unset: a user's explicit value wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InputError
from .hookmarkers import hookimpl
from .jobspec import MEMORY_PER_CPU, MEMORY_PER_GPU, JobSpec
from .units import format_duration

STOP_GRACE = 30     # seconds from SIGTERM to SIGKILL at the time limit (Slurm's KillWait)
# seconds past a stop's grace (preemption, overrun) before the service requeues the job by
# force: a launcher that beats within grace + this hears of the stop in time
STOP_SLACK = 10.0


@dataclass(frozen=True)
class Defaults:
    """What the queue policy gives a job that neither it nor its class sets."""
    memory_per_gpu: int = MEMORY_PER_GPU
    memory_per_cpu: int = MEMORY_PER_CPU
    time_limit: int | None = None        # seconds; None: no limit
    max_time_limit: int | None = None
    stop_grace: int = STOP_GRACE
    cpu_allocation: str = "core"


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
    # the time limit of a job that sets none, the most it may set (seconds), and the
    # seconds its replicas get between SIGTERM and SIGKILL at the limit (else the policy's)
    default_time_limit: int | None = None
    max_time_limit: int | None = None
    stop_grace: int | None = None
    # Preemption (priority rules, quota reclaim): whether its jobs may be stopped for
    # another and requeued (a job that may not is never lent idle quota either), the
    # signal its replicas get to checkpoint, the seconds until SIGKILL (else the stop
    # grace), and how often it checkpoints (what a preemption loses; none: all of it)
    preemptible: bool = True
    preempt_signal: Literal["SIGTERM", "SIGUSR1", "SIGINT"] = "SIGTERM"
    preempt_grace: int | None = None
    checkpoint_interval: int | None = None
    # Idle GPUs (the policy's `idle:` otherwise): seconds under the threshold before its
    # jobs are flagged (0: never flag them), the threshold (percent) and the action
    idle_after: int | None = None
    idle_threshold: float | None = None
    idle_action: Literal["notify", "requeue"] | None = None

    def check(self, spec: JobSpec) -> list[str]:
        problems = []
        if not self.gpu_roles and spec.total_gpus:
            problems.append(f"job class {self.name!r} is CPU-only but the job asks for "
                            f"{spec.total_gpus} GPUs; set gpus: 0 or use another class")
        if not self.gpu_roles and spec.total_mig_devices:
            problems.append(f"job class {self.name!r} is CPU-only but the job asks for "
                            f"{spec.total_mig_devices} MIG devices; remove gpu.mig or use "
                            "another class")
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
             default_time_limit=2 * 3600, max_time_limit=24 * 3600,
             # short runs on a suspect GPU: end them; the Airflow task's retries decide
             on_gpu_failure="cancel"),
]


@hookimpl
def airflow_gpu_job_classes() -> list[JobClass]:
    return BUILTIN


def resolve(spec: JobSpec, classes: dict[str, JobClass], source: str | None = None,
            defaults: Defaults | None = None) -> JobSpec:
    """The spec with its class applied and what it leaves unset filled: every role's
    memory (the class's per GPU and per CPU, else the policy's), the time limit (the
    class's, else the policy's; never above the class's or the policy's maximum, and the
    estimate never above it) and the CPU allocation. An unknown class, a broken class
    rule or a limit above the maximum is an error."""
    defaults = defaults or Defaults()
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
    update: dict[str, Any] = {}
    if any(r.memory is None for r in spec.roles):
        per_gpu = jc.memory_per_gpu if jc and jc.memory_per_gpu is not None else \
            defaults.memory_per_gpu
        per_cpu = jc.memory_per_cpu if jc and jc.memory_per_cpu is not None else \
            defaults.memory_per_cpu
        update["roles"] = [r if r.memory is not None else r.model_copy(update={
            "memory": r.booked_memory(per_gpu, per_cpu)}) for r in spec.roles]
    limit = _time_limit(spec, jc, defaults, source)
    if limit != spec.time_limit:
        update["time_limit"] = limit
    if limit is not None and spec.expected_runtime and spec.expected_runtime > limit:
        update["expected_runtime"] = limit     # it cannot run longer (a class's default)
    if "cpu_allocation" not in spec.placement.model_fields_set:
        update["placement"] = spec.placement.model_copy(
            update={"cpu_allocation": defaults.cpu_allocation})
    return spec.model_copy(update=update) if update else spec


def _time_limit(spec: JobSpec, jc: JobClass | None, defaults: Defaults,
                source: str | None) -> int | None:
    limit = spec.time_limit
    if limit is None:
        limit = jc.default_time_limit if jc and jc.default_time_limit else defaults.time_limit
    for most, whose in ((jc.max_time_limit if jc else None, f"job class {spec.job_class!r}"),
                        (defaults.max_time_limit, "the queue policy")):
        if most is None:
            continue
        if limit is None or (spec.time_limit is None and limit > most):
            # no limit asked: the most allowed (Slurm's MaxTime), also where a class's
            # default is above the policy's maximum (the job asked for nothing to refuse)
            limit = most
        elif limit > most:
            raise InputError(f"job {spec.name!r}: time_limit: {format_duration(limit)} is "
                             f"more than {whose} allows ({format_duration(most)}); ask for "
                             f"at most {format_duration(most)}", source)
    return limit


def stop_grace(spec: JobSpec, classes: dict[str, JobClass], defaults: Defaults) -> int:
    """Seconds the job's replicas get from SIGTERM to SIGKILL at its time limit."""
    jc = classes.get(spec.job_class or "")
    return jc.stop_grace if jc and jc.stop_grace is not None else defaults.stop_grace


def preempt_options(jc: JobClass | None, stop_grace: float
                    ) -> tuple[bool, str, float, float | None]:
    """(preemptible, signal, grace, checkpoint interval) of a job of class `jc`."""
    if jc is None:
        return True, "SIGTERM", float(stop_grace), None
    grace = jc.preempt_grace if jc.preempt_grace is not None else stop_grace
    return jc.preemptible, jc.preempt_signal, float(grace), jc.checkpoint_interval


def timeout_message(limit: float, grace: float, ended: str | None = None) -> str:
    """Why a job ended `timeout`, naming its limit (events, the operators' failures);
    `ended`: how its replicas ended, where the launcher saw it (supervise.Ending)."""
    how = (f"its time limit of {format_duration(limit)} (time_limit; ask for more if it "
           "needs longer)")
    if ended:
        return f"the job reached {how}: stopped with SIGTERM; {ended}"
    return (f"the job reached {how}: stopped with SIGTERM, and SIGKILL for what still ran "
            f"{grace:g}s later")
