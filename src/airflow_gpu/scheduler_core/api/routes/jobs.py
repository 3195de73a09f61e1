"""Jobs: submit, list, show, explain, cancel, and the launcher's heartbeat and finish."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response
from fastapi.concurrency import run_in_threadpool

from ...service import notify
from ...service.batch import submit_batch
from ...service.common import LIVE
from ...service.duedates import due
from .. import shown, submits
from ..bodies import DecodedOffLoop
from ..deps import JobRef, Svc, Who
from ..models.base import NAME, States
from ..models.jobs import ExplainOut, FinishRequest, JobOut, SubmitRequest
from ..models.notifications import NotificationOut

router = APIRouter(route_class=DecodedOffLoop)


@router.post("/api/v1/jobs", status_code=201, response_model=JobOut)
async def submit(body: SubmitRequest, p: Who, response: Response, service: Svc,
                 idempotency_key: Annotated[str | None, Header(max_length=200)] = None):
    key = body.idempotency_key or idempotency_key
    if body.spec.array is not None or body.spec.depends_on:
        # one job per index and what it waits for, in one transaction (batch.py)
        rows, created = await run_in_threadpool(submit_batch, service, [body.spec], p,
                                                [key], True)
        row = rows[0]
    else:
        row, created = await submits.submit(      # stored with concurrent submits
            service, body.spec, p, key)
    if not created:
        response.status_code = 200
    return JobOut.of(row)


@router.get("/api/v1/jobs", response_model=list[JobOut])
def list_jobs(p: Who, service: Svc, state: States | None = None,
              team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
              name: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
              order: Literal["submitted", "newest"] = "submitted",
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000):
    from ...service.jobcontrol import name_blockers

    jobs = service.list_jobs(state, team, limit, name, order == "newest")
    live = service.live_allocations([j.id for j in jobs if j.state in LIVE])
    now = time.time()
    return shown.jobs(name_blockers(service, [JobOut.of(j, live.get(j.id), due=due(
        service, j, now)) for j in jobs]), p)


@router.get("/api/v1/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: JobRef, p: Who, service: Svc):
    from ...service.jobcontrol import name_blockers

    j = service.get(job_id)
    out = _with_hosts(service, j, due(service, j, time.time()))
    return shown.jobs(name_blockers(service, [out]), p)[0]


def _with_hosts(service, j, due: dict | None = None) -> JobOut:
    """A job read on its own: its replicas carry their hosts' addresses (launchers)."""
    service.refresh_cluster()
    return JobOut.of(j, service.allocations(j.id), service.cluster.by_name, due)


@router.delete("/api/v1/jobs/{job_id}", response_model=JobOut)
def cancel(job_id: JobRef, p: Who, service: Svc):
    return JobOut.of(service.cancel(job_id, p), service.allocations(job_id))


@router.get("/api/v1/jobs/{job_id}/explain", response_model=ExplainOut)
def explain(job_id: JobRef, p: Who, service: Svc):
    from ...service.jobcontrol import blockers, name_jobs

    j = service.get(job_id)
    now = time.time()
    out = ExplainOut.of(j, service.events(job_id), now, due(service, j, now))
    out.blockers, names = blockers(service, j)     # the jobs it waits for, by name
    out.reason = name_jobs(out.reason, names)
    out.notifications = shown.notifications(
        [NotificationOut.of(n) for n in notify.of_job(service, job_id)], p)
    return out


@router.post("/api/v1/jobs/{job_id}/heartbeat", response_model=JobOut)
def heartbeat(job_id: JobRef, p: Who, service: Svc,
              attempt: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None):
    j, allocations = service.heartbeat(job_id, p, attempt)
    service.refresh_cluster()
    return JobOut.of(j, allocations, service.cluster.by_name)


@router.post("/api/v1/jobs/{job_id}/finish", response_model=JobOut)
def finish(job_id: JobRef, body: FinishRequest, p: Who, service: Svc):
    return JobOut.of(service.finish(job_id, p, body.outcome, body.exit_code, body.attempt),
                     service.allocations(job_id))
