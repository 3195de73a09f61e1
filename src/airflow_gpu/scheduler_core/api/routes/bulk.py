"""Many jobs or hosts at once: `POST /api/v1/jobs/cancel` (scancel with filters; an
array: service/cancels.py) and `POST /api/v1/hosts/drain`, `/resume` (host ranges)."""

from __future__ import annotations

from fastapi import APIRouter

from ...errors import InputError
from ...jobspec import expand_hostlist
from ...service.cancels import Filters, bulk_cancel
from ..bodies import DecodedOffLoop
from ..deps import Svc, Who
from ..models.bulk import CancelOut, CancelRequest, HostsDrainRequest, HostsOut, HostsRequest

router = APIRouter(route_class=DecodedOffLoop)


@router.post("/api/v1/jobs/cancel", response_model=CancelOut)
def cancel_jobs(body: CancelRequest, p: Who, service: Svc):
    """Cancel every job the references and filters match (all of them must), in one
    transaction; `dry_run`: only say which."""
    f = Filters(jobs=body.jobs, team=body.team, state=body.state, name=body.name,
                submitted_before=body.submitted_before, user=body.user)
    return bulk_cancel(service, f, p, body.dry_run)


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
