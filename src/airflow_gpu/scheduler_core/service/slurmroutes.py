"""The API of Slurm's and Grid Engine's habits (docs/service.md, "Coming from Slurm / Grid
Engine"): the queue in the scheduler's order (squeue), priority factors (sprio), fair
share (sshare), hold and release (scontrol hold/release, qhold/qrls), update (scontrol
update, qalter) and requeue (scontrol requeue). The work is in priority.py and
jobcontrol.py. (No `from __future__ import annotations`: the routes' annotations name
the dependencies given to add_routes, which FastAPI must see as objects.)"""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query
from pydantic import Field

from .core import LIVE, Principal, Service
from .schemas import JobOut, _In

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
States = Literal["pending", "admitted", "running", "preempting", "succeeded", "failed",
                 "cancelled", "lost", "timeout"]


class QueueEntry(JobOut):
    rank: int | None = Field(None, description="a pending job's place in the order the "
                             "scheduler considers them (1: first); none for the others")
    band: float | None = Field(None, description="priority + job-class weight (pending)")
    score: float | None = Field(None, description="fair share + size + age points within "
                                "the band (pending; GET /api/v1/priorities)")
    eta_at: datetime | None = Field(None, description="a pending job's planned start")
    eta_s: int | None = Field(None, description="seconds until eta_at")
    elapsed_s: int | None = Field(None, description="since admission: to now while live, "
                                  "to its end once ended")
    reason: str | None = Field(None, description="why a pending job waits, the jobs it "
                               "names given by name and short id")


class UpdateRequest(_In):
    priority: int | None = Field(None, ge=-1_000_000, le=1_000_000,
                                 description="a pending job's new priority")
    time_limit: str | int | None = Field(None, description="the new time limit (e.g. 2h): "
                                         "within the job class's and the policy's maximum; "
                                         "a live job's may be raised by admins only")


def add_routes(app: FastAPI, service: Service, not_agent, job_ref) -> None:
    Who = Annotated[Principal, Depends(not_agent)]
    JobRef = Annotated[str, Depends(job_ref)]

    @app.get("/api/v1/queue", response_model=list[QueueEntry])
    def queue(_: Who, all: bool = False, state: States | None = None,  # noqa: A002
              team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000):
        """Slurm's squeue: live jobs (admitted, running, preempting) by start, then
        pending jobs in the order the scheduler considers them, then held ones; `all`
        adds ended jobs (newest first)."""
        from .priority import queue as ordered

        jobs = ordered(service, all, state, team, limit)
        live = service.live_allocations([j.id for j, _ in jobs if j.state in LIVE])
        outs = []
        for j, extra in jobs:
            out = JobOut.of(j, live.get(j.id))
            if out.pending is not None:       # the reason as queue names its jobs
                out.pending.reason = extra["reason"]
            outs.append(QueueEntry(**{**out.model_dump(), **extra}))
        return outs

    @app.get("/api/v1/priorities")
    def priorities(_: Who, team: Annotated[str | None, Query(max_length=200,
                                                             pattern=NAME)] = None
                   ) -> dict[str, Any]:
        """Slurm's sprio: each pending job's band and score terms (fair share, size,
        age) as the scheduler computes them, in its order."""
        from .priority import priorities as factors

        return factors(service, team)

    @app.get("/api/v1/shares")
    def shares(_: Who) -> list[dict[str, Any]]:
        """Slurm's sshare: per team its share, decayed usage, fair-share factor and
        quota use, from the fair share the scheduler orders by."""
        from .priority import shares as fair

        return fair(service)

    @app.post("/api/v1/jobs/{job_id}/hold", response_model=JobOut)
    def hold(job_id: JobRef, p: Who):
        """A pending job is not started until released (JobHeldUser; JobHeldAdmin when
        an admin holds it, which only an admin releases)."""
        from .jobcontrol import hold as do

        return JobOut.of(do(service, job_id, p))

    @app.post("/api/v1/jobs/{job_id}/release", response_model=JobOut)
    def release(job_id: JobRef, p: Who):
        from .jobcontrol import release as do

        return JobOut.of(do(service, job_id, p))

    @app.post("/api/v1/jobs/{job_id}/requeue", response_model=JobOut)
    def requeue(job_id: JobRef, p: Who):
        """Stop a live job (its class's signal and grace) and requeue it under the same
        id, like a preemption."""
        from .jobcontrol import requeue as do

        return JobOut.of(do(service, job_id, p), service.allocations(job_id))

    @app.patch("/api/v1/jobs/{job_id}", response_model=JobOut)
    def update(job_id: JobRef, body: UpdateRequest, p: Who):
        """Change a pending job's priority, or a job's time limit."""
        from .jobcontrol import update as do

        return JobOut.of(do(service, job_id, p, body.priority, body.time_limit),
                         service.allocations(job_id))
