"""Many jobs or hosts at once: `POST /api/v1/jobs/cancel` (scancel with filters; an
array: service/cancels.py), `/hold`, `/release` and `/update` (an array's elements at
once: service/bulkcontrol.py) and `POST /api/v1/hosts/drain`, `/resume` (host ranges)."""

from __future__ import annotations

from fastapi import APIRouter

from ...errors import InputError
from ...jobspec import expand_hostlist
from ...service import bulkcontrol
from ...service.cancels import Filters, bulk_cancel
from ...service.common import LIVE
from ...service.jobcontrol import name_blockers
from ..bodies import DecodedOffLoop
from ..deps import Svc, Who
from ..models.bulk import (
    CancelOut,
    CancelRequest,
    HostsDrainRequest,
    HostsOut,
    HostsRequest,
    JobsChangedOut,
    JobsRequest,
    JobsUpdateRequest,
)
from ..models.jobs import JobOut

router = APIRouter(route_class=DecodedOffLoop)


@router.post("/api/v1/jobs/cancel", response_model=CancelOut)
def cancel_jobs(body: CancelRequest, p: Who, service: Svc):
    """Cancel every job the references and filters match (all of them must), in one
    transaction; `dry_run`: only say which."""
    f = Filters(jobs=body.jobs, team=body.team, state=body.state, name=body.name,
                submitted_before=body.submitted_before, user=body.user)
    return bulk_cancel(service, f, p, body.dry_run)


def _changed(service, got: dict) -> dict:
    """The answer, its jobs as `GET /api/v1/jobs/{id}` gives them (live ones' grants, the
    jobs a reason names by name and short id)."""
    live = service.live_allocations([j.id for j in got["jobs"] if j.state in LIVE])
    return {**got, "jobs": name_blockers(service, [JobOut.of(j, live.get(j.id))
                                                   for j in got["jobs"]])}


@router.post("/api/v1/jobs/hold", response_model=JobsChangedOut)
def hold_jobs(body: JobsRequest, p: Who, service: Svc):
    """Hold every pending job the references name (an array: each pending element), in
    one transaction (scontrol hold ARRAY)."""
    return _changed(service, bulkcontrol.hold_many(service, body.jobs, p))


@router.post("/api/v1/jobs/release", response_model=JobsChangedOut)
def release_jobs(body: JobsRequest, p: Who, service: Svc):
    """Release every held job the references name, in one transaction."""
    return _changed(service, bulkcontrol.release_many(service, body.jobs, p))


@router.post("/api/v1/jobs/update", response_model=JobsChangedOut)
def update_jobs(body: JobsUpdateRequest, p: Who, service: Svc):
    """Change the priority, time limit or (arrays) max_running of every job the
    references name, in one transaction (scontrol update jobid=ARRAY ...)."""
    return _changed(service, bulkcontrol.update_many(
        service, body.jobs, p, body.priority, body.time_limit, body.max_running))


def _hosts(text: str) -> list[str]:
    try:
        names = list(dict.fromkeys(expand_hostlist(text)))
    except ValueError as exc:
        raise InputError(f"hosts: {exc}") from None
    if not names:
        raise InputError(f"hosts: {text!r} names no host; give names or ranges such as "
                         "dgx-a-[01-04],dgx-h-05")
    return names


def _out(rows) -> dict:
    return {"hosts": [{"name": r.name, "drained": r.drained, "drain_reason": r.drain_reason}
                      for r in rows]}


@router.post("/api/v1/hosts/drain", response_model=HostsOut)
def drain_hosts(body: HostsDrainRequest, p: Who, service: Svc):
    """Drain every host the names and ranges give (admins), all or none."""
    return _out(service.set_drained_many(_hosts(body.hosts), True, p, body.reason))


@router.post("/api/v1/hosts/resume", response_model=HostsOut)
def resume_hosts(body: HostsRequest, p: Who, service: Svc):
    """Resume every host the names and ranges give (admins), all or none."""
    return _out(service.set_drained_many(_hosts(body.hosts), False, p))
