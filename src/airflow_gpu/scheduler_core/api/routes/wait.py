"""Waiting for jobs to change state, by long poll: a launcher learns of its admission as
soon as the pass that admits it commits, with one request instead of a poll every few
seconds. `GET /api/v1/jobs/{id}/wait` waits for one job (an operator's admission
grace); `POST /api/v1/jobs/wait` for many in one request (the triggerer's watcher: all
its deferred GPU tasks)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlalchemy import select

from ...service.changes import POLL
from ...service.common import LIVE
from ...service.errors import NotFound
from ...service.jobcontrol import name_blockers
from ...store.models import JobRow
from .. import shown
from ..bodies import DecodedOffLoop
from ..deps import JobRef, Svc, Who
from ..models.base import RequestBody, States
from ..models.jobs import JobOut

router = APIRouter(route_class=DecodedOffLoop)

MAX_WAIT = 60.0       # seconds one request may wait (proxies cut idle requests near here)
MAX_IDS = 1000


class WaitRequest(RequestBody):
    ids: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=MAX_IDS)
    state: States = "pending"
    timeout: float = Field(30.0, ge=0, le=MAX_WAIT)


class WaitOut(BaseModel):
    jobs: list[JobOut]        # those no longer in `state`; at the timeout, all of them
    missing: list[str]        # ids no job has
    timed_out: bool


def _read(service, ids: list[str], state: str | None, changed: bool) -> tuple[list, list]:
    """The jobs of `ids` that are no longer in `state` (all of them unless `changed`),
    with their grants, and the ids no job has. Their states are read first (a waiter
    reads again at each change, for hundreds of ids), whole rows only for those."""
    with service.reads() as s:
        states = dict(s.execute(select(JobRow.id, JobRow.state)
                                .where(JobRow.id.in_(ids))).all())
        missing = [i for i in ids if i not in states]
        want = [i for i, st in states.items() if not changed or st != state]
        rows = list(s.scalars(select(JobRow).where(JobRow.id.in_(want)))) if want else []
    live = service.live_allocations([r.id for r in rows if r.state in LIVE])
    # pending reasons name their blockers as GET /api/v1/jobs/{id} does
    return name_blockers(service, [JobOut.of(r, live.get(r.id)) for r in rows]), missing


async def _wait(request: Request, service, ids: list[str], state: str,
                timeout: float) -> WaitOut:
    deadline = time.monotonic() + timeout
    while True:
        version = service.changes.version
        jobs, missing = await run_in_threadpool(_read, service, ids, state, True)
        left = deadline - time.monotonic()
        if jobs or missing or left <= 0 or await request.is_disconnected():
            break
        await service.changes.wait(version, min(POLL, left))
    if not jobs and not missing:            # timed out: how each one stands now
        jobs, missing = await run_in_threadpool(_read, service, ids, state, False)
        return WaitOut(jobs=jobs, missing=missing, timed_out=True)
    return WaitOut(jobs=jobs, missing=missing, timed_out=False)


@router.post("/api/v1/jobs/wait", response_model=WaitOut)
async def wait_jobs(body: WaitRequest, request: Request, p: Who, service: Svc):
    """As soon as one or more of `ids` is no longer in `state`: those jobs; at the
    timeout: every one of them as it is now (their pending reasons)."""
    out = await _wait(request, service, list(dict.fromkeys(body.ids)), body.state,
                      body.timeout)
    out.jobs = shown.jobs(out.jobs, p)
    return out


@router.get("/api/v1/jobs/{job_id}/wait", response_model=JobOut)
async def wait_job(job_id: JobRef, request: Request, p: Who, service: Svc,
                   state: States | None = None,
                   timeout: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 30.0):
    """The job once it is no longer in `state` (default: the state it is in now), or as
    it is at the timeout."""
    if state is None:
        state = (await run_in_threadpool(service.get, job_id)).state
    out = await _wait(request, service, [job_id], state, timeout)
    if out.missing:
        raise NotFound(f"job {job_id!r} does not exist (any more)")
    return shown.jobs(out.jobs, p)[0]
