"""`plan`: what would start now, in priority order, on a cluster that fills up as jobs start.

The same engine calls serve the CLI, and later the service and the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobclasses import resolve
from .jobspec import JobSpec
from .placement import Placed, Unplaced, compile_needs, never_fits, place
from .plugins import Registry, default_registry
from .state import ClusterState


@dataclass
class PlanResult:
    admitted: list[tuple[JobSpec, Placed]] = field(default_factory=list)
    pending: list[tuple[JobSpec, Unplaced, int | None]] = field(default_factory=list)
    rejected: list[tuple[JobSpec, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "admitted": [{"job": j.name, "team": j.team, "priority": j.priority,
                          "replicas": [a.to_dict() for a in p.allocations]}
                         for j, p in self.admitted],
            "pending": [{"job": j.name, "team": j.team, "priority": j.priority,
                         "code": u.code, "reason": u.message, "eta_seconds": eta,
                         "details": u.details} for j, u, eta in self.pending],
            "rejected": [{"job": j.name, "error": e} for j, e in self.rejected],
        }


def effective_priority(job: JobSpec, reg: Registry) -> int:
    jc = reg.job_classes.get(job.job_class or "")
    return job.priority + (jc.priority_weight if jc else 0)


def plan(state: ClusterState, jobs: list[JobSpec], reg: Registry | None = None,
         default_runtime: int = 3600) -> PlanResult:
    """Admit `jobs` in priority order (ties: list order) onto `state`, which is updated."""
    reg = reg or default_registry()
    resolved = [resolve(j, reg.job_classes) for j in jobs]
    order = sorted(range(len(resolved)), key=lambda i: (-effective_priority(resolved[i], reg), i))
    empty = state.empty_like()
    result = PlanResult()
    ends: list[tuple[int, str]] = []   # (expected end in seconds from now, job)
    for i in order:
        job = resolved[i]
        needs = compile_needs(job)
        got = place(job, state, reg, needs)
        if isinstance(got, Placed):
            state.commit(job.name, got.allocations)
            result.admitted.append((job, got))
            ends.append((job.expected_runtime or default_runtime, job.name))
            continue
        error = never_fits(job, empty, reg, needs)
        if error:
            result.rejected.append((job, error))
        else:
            got.explain()  # now, against the state this job saw
            result.pending.append((job, got, None))
    result.pending = [(j, u, _eta(j, state, ends, reg)) for j, u, _ in result.pending]
    return result


def _eta(job: JobSpec, state: ClusterState, ends: list[tuple[int, str]],
         reg: Registry) -> int | None:
    """Seconds until the job would fit if the admitted jobs end as expected and nothing
    else starts first (reservations refine this in the queue policy)."""
    held = {name: state.allocations[name] for _, name in ends}
    needs = compile_needs(job)
    eta = None
    released: list[str] = []
    for t, name in sorted(ends):
        state.release(name)
        released.append(name)
        if isinstance(place(job, state, reg, needs), Placed):
            eta = t
            break
    for name in released:
        state.commit(name, held[name])
    return eta
