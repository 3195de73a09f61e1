"""The built-in health scorer: long jobs keep off worn GPUs first. A plugin like any other.

A worn GPU (`ClusterState.set_degraded_gpus`: correctable ECC or NVLink error counts
rising, thermal throttling) stays schedulable: nothing waits because of wear. Among the
hosts that fit, a host scores down by the worn GPUs a replica would have to take there
(its GPUs beyond the free GPUs that are not worn), times the job's expected runtime in
hours (at most `cap`; a job without one counts as `cap`). Jobs expected to end within
`short` seconds are not steered at all, so they still use worn GPUs (often the tightest
fit) and leave the others to long jobs. Inside a host, GPU selection takes worn GPUs
last for every job (engine/gpu_selection.py).

The scorer applies only to a state with worn GPUs (`applies`), so an ordinary pass
keeps the engine's unscored fast path; its `max_score` (0: a host where the replica
needs no worn GPU) lets a one-host placement look past the tightest hosts for one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hookmarkers import hookimpl

if TYPE_CHECKING:
    from .engine.cluster import Host
    from .engine.state import ClusterState, HostState
    from .jobspec import JobSpec, Role

HOUR = 3600


class HealthScorer:
    """-(worn GPUs a replica of the role takes on the host) x (expected runtime, hours)."""

    max_score = 0.0

    def __init__(self, short: float = HOUR, cap: float = 24 * HOUR):
        self.short = short      # jobs expected to run at most this long are not steered
        self.cap = cap          # the weight of longer jobs (and of jobs without a runtime)

    def weight(self, job: JobSpec) -> float:
        runtime = job.expected_runtime
        if runtime is None:
            return self.cap / HOUR
        if runtime <= self.short:
            return 0.0
        return min(runtime, self.cap) / HOUR

    def applies(self, state: ClusterState) -> bool:
        return state.any_worn

    def __call__(self, job: JobSpec, role: Role, host: Host, state: HostState) -> float:
        worn = state.worn_gpus
        if not worn or not role.gpus:
            return 0.0
        clean = (state.usable_gpus & ~worn).bit_count()
        taken = role.gpus - clean
        if taken <= 0:
            return 0.0
        return -taken * self.weight(job)

    def __repr__(self) -> str:
        return f"HealthScorer(short={self.short:g}, cap={self.cap:g})"


@hookimpl
def airflow_gpu_host_scorers() -> list[HealthScorer]:
    return [HealthScorer()]
