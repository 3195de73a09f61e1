"""The routes of Slurm's and Grid Engine's habits (docs/service.md, "Coming from Slurm /
Grid Engine"): the queue in the scheduler's order (squeue), priority factors (sprio), fair
share (sshare), hold and release (scontrol hold/release, qhold/qrls), update (scontrol
update, qalter) and requeue (scontrol requeue). The work is in service/priority.py and
service/jobcontrol.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ...service.common import LIVE
from .. import shown
from ..bodies import DecodedOffLoop
from ..deps import JobRef, Svc, Who
from ..models.base import NAME, States
from ..models.jobs import JobOut
from ..models.queue import QueueEntry, UpdateRequest

router = APIRouter(route_class=DecodedOffLoop)


@router.get("/api/v1/queue", response_model=list[QueueEntry])
def queue(p: Who, service: Svc, all: bool = False,  # noqa: A002
          state: States | None = None,
          team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
          limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
          user: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None):
    """Slurm's squeue: live jobs (admitted, running, preempting) by start, then
    pending jobs in the order the scheduler considers them, then held ones; `all`
    adds ended jobs (newest first); `user`: only that user's (squeue -u)."""
    from ...service.priority import queue as ordered

    jobs = ordered(service, all, state, team, limit, user)
    live = service.live_allocations([j.id for j, _ in jobs if j.state in LIVE])
    outs = []
    for j, extra in jobs:
        out = JobOut.of(j, live.get(j.id))
        if out.pending is not None:       # the reason as queue names its jobs
            out.pending.reason = extra["reason"]
        outs.append(QueueEntry(**{**out.model_dump(), **extra}))
    return shown.jobs(outs, p)


@router.get("/api/v1/priorities")
def priorities(_: Who, service: Svc,
               team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
               user: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None
               ) -> dict[str, Any]:
    """Slurm's sprio: each pending job's band and score terms (fair share, size,
    age) as the scheduler computes them, in its order."""
    from ...service.priority import priorities as factors

    return factors(service, team, user)


@router.get("/api/v1/shares")
def shares(_: Who, service: Svc) -> list[dict[str, Any]]:
    """Slurm's sshare: per team its share, decayed usage, fair-share factor and
    quota use, from the fair share the scheduler orders by."""
    from ...service.priority import shares as fair

    return fair(service)


@router.post("/api/v1/jobs/{job_id}/hold", response_model=JobOut)
def hold(job_id: JobRef, p: Who, service: Svc):
    """A pending job is not started until released (JobHeldUser; JobHeldAdmin when
    an admin holds it, which only an admin releases)."""
    from ...service.jobcontrol import hold as do

    return _named(service, JobOut.of(do(service, job_id, p)))


@router.post("/api/v1/jobs/{job_id}/release", response_model=JobOut)
def release(job_id: JobRef, p: Who, service: Svc):
    from ...service.jobcontrol import release as do

    return _named(service, JobOut.of(do(service, job_id, p)))


@router.post("/api/v1/jobs/{job_id}/requeue", response_model=JobOut)
def requeue(job_id: JobRef, p: Who, service: Svc):
    """Stop a live job (its class's signal and grace) and requeue it under the same
    id, like a preemption."""
    from ...service.jobcontrol import requeue as do

    return JobOut.of(do(service, job_id, p), service.allocations(job_id))


@router.patch("/api/v1/jobs/{job_id}", response_model=JobOut)
def update(job_id: JobRef, body: UpdateRequest, p: Who, service: Svc):
    """Change a pending job's priority, or a job's time limit."""
    from ...service.jobcontrol import update as do

    return _named(service, JobOut.of(do(service, job_id, p, body.priority, body.time_limit),
                                      service.allocations(job_id)))


def _named(service, out: JobOut) -> JobOut:
    """The job as GET gives it: the jobs its pending reason names, by name and short id."""
    from ...service.jobcontrol import name_blockers

    return name_blockers(service, [out])[0]
