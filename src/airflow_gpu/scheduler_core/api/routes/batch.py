"""`POST /api/v1/jobs/batch`: several jobs at once, all or none (service/batch.py);
`POST /api/v1/jobs/heartbeats`: the heartbeats of many jobs at once (service/beats.py)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool

from ...service.batch import submit_batch
from ...service.beats import heartbeats
from ..bodies import DecodedOffLoop
from ..deps import Svc, Who
from ..errors import status_of
from ..models.batch import BatchSubmitRequest, BeatOut, HeartbeatsOut, HeartbeatsRequest, RefusedOut
from ..models.jobs import JobOut

router = APIRouter(route_class=DecodedOffLoop)


@router.post("/api/v1/jobs/batch", status_code=201, response_model=list[JobOut],
             responses={200: {"description": "every idempotency key was seen before: the "
                              "jobs they created, nothing new"}})
async def submit_batch_route(body: BatchSubmitRequest, response: Response, p: Who,
                             service: Svc):
    """Submit 1 to 1000 jobs, all or none: any job refused (422, or 403 for another
    team's; 409 for an idempotency key used before with another spec) refuses the
    batch, naming the job by index and name. 201 with the jobs in the order given;
    200 when every key was seen before (the jobs they created)."""
    rows, created = await run_in_threadpool(
        submit_batch, service, [j.spec for j in body.jobs], p,
        [j.idempotency_key for j in body.jobs])
    if not created:
        response.status_code = 200
    return [JobOut.of(r) for r in rows]


@router.post("/api/v1/jobs/heartbeats", response_model=HeartbeatsOut)
def heartbeats_route(body: HeartbeatsRequest, p: Who, service: Svc):
    """The heartbeats of 1 to 1000 jobs in one request (a launcher that runs many): each
    job's lease is extended (its first heartbeat confirms its start) as its own heartbeat
    would, in one short transaction. 200 with the jobs beaten and those refused, each with
    the status and words its single heartbeat would get (403, 404, 409: stop that job)."""
    beaten, refused = heartbeats(service, [(b.id, b.attempt) for b in body.jobs], p)
    return HeartbeatsOut(jobs=[BeatOut.of(j) for j in beaten],
                         refused=[RefusedOut(id=r.id, status=status_of(r.error),
                                             detail=str(r.error)) for r in refused])
