"""`plan`: one scheduling pass at time 0 on a cluster, every job submitted at once.

What starts, what waits (with its reason and ETA, from the reservations the pass
makes), what can never run and what the job's class or the policy refuses (a time limit
over their maximum, an unknown class: the service refuses these at submit). A refused
job is left out and the others are planned. The pass is `Scheduler.schedule`, the same
one the simulator and the service run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..engine.placement import Placed
from ..engine.state import ClusterState
from ..errors import InputError
from ..jobspec import JobSpec
from ..plugins import Registry
from .config import PolicyConfig
from .scheduler import Pending, Rejected, Scheduler
from .windows import Window, too_long


@dataclass
class PlanResult:
    admitted: list[tuple[JobSpec, Placed]] = field(default_factory=list)
    pending: list[tuple[JobSpec, Pending]] = field(default_factory=list)
    rejected: list[tuple[JobSpec, str]] = field(default_factory=list)
    # (its index in the list planned, the job, why), the job's name left out of why
    refused: list[tuple[int, JobSpec, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "admitted": [{"job": j.name, "team": j.team, "priority": j.priority,
                          "replicas": [a.to_dict() for a in p.allocations]}
                         for j, p in self.admitted],
            "pending": [{"job": j.name, "team": j.team, "priority": j.priority, **w.to_dict()}
                        for j, w in self.pending],
            "rejected": [{"job": j.name, "error": e} for j, e in self.rejected],
            "refused": [{"job": j.name, "index": i, "error": e} for i, j, e in self.refused],
        }


def plan(state: ClusterState, jobs: list[JobSpec], reg: Registry | None = None,
         config: PolicyConfig | None = None, windows: list[Window] = ()) -> PlanResult:
    """Submit `jobs` at time 0 (ties in priority: list order) and run one pass on `state`,
    which keeps what started; `windows`: admins' reservations, times from then."""
    sched = Scheduler(state, config, reg)
    sched.set_windows(list(windows))
    result = PlanResult()
    wall = time.time()
    for i, spec in enumerate(jobs):
        try:
            # time 0 is now: a deadline counts from the wall clock
            sched.submit(spec, 0.0, deadline=None if spec.deadline is None
                         else spec.deadline.timestamp() - wall)
        except Rejected as exc:
            result.rejected.append((spec, exc.reason))
        except InputError as exc:       # its class or the policy: the others still plan
            result.refused.append((i, spec, str(exc).removeprefix(f"job {spec.name!r}: ")))
        else:                           # longer than its reservation: the service refuses it
            job, w = sched.queue.jobs.get(spec.name), sched.windows.get(spec.reservation or "")
            why = None if w is None or job is None else too_long(
                w, job.spec, job.runtime, 0.0, asked=spec.time_limit)
            if why:
                sched.finish(spec.name, 0.0)
                result.rejected.append((spec, why))
    done = sched.schedule(0.0, explain=True)
    result.admitted = [(j.spec, placed) for j, placed in done.started]
    waiting = sched.queue.jobs
    result.pending = [(waiting[name].spec, why) for name, why in done.pending.items()]
    return result
