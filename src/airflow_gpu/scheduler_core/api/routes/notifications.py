"""Webhook notifications: a job's, with their delivery state (any token, as `explain`),
and every undelivered one (admins)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from ...service import notify
from ...service.errors import Forbidden
from .. import shown
from ..bodies import DecodedOffLoop
from ..deps import JobRef, Svc, Who
from ..models.notifications import NotificationOut

router = APIRouter(route_class=DecodedOffLoop)


@router.get("/api/v1/jobs/{job_id}/notifications", response_model=list[NotificationOut])
def of_job(job_id: JobRef, p: Who, service: Svc):
    service.get(job_id)                  # 404 for a job that does not exist
    return shown.notifications([NotificationOut.of(n) for n in notify.of_job(service,
                                                                              job_id)], p)


@router.get("/api/v1/notifications", response_model=list[NotificationOut])
def undelivered(p: Who, service: Svc,
                state: Literal["pending", "given_up"] | None = None,
                limit: Annotated[int, Query(ge=1, le=10_000)] = 1000):
    """Notifications not delivered (pending, retrying or given up), oldest first (admins)."""
    if not p.admin:
        raise Forbidden(f"only admins list undelivered notifications; your token is team "
                        f"{p.team!r}'s (a job's own: GET /api/v1/jobs/ID/notifications)")
    return [NotificationOut.of(n) for n in notify.undelivered(service, state, limit)]
