"""GPU accounting: a job's usage, and reports over a window (service/acct.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from ...errors import InputError
from ...service import acct
from ...service.common import utcnow
from ..bodies import DecodedOffLoop
from ..deps import JobRef, Svc, Who
from ..models.base import NAME

router = APIRouter(route_class=DecodedOffLoop)


def _aware(at: datetime | None) -> datetime | None:
    """A time without a zone is UTC (what the API writes)."""
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


@router.get("/api/v1/jobs/{job_id}/usage")
def job_usage(job_id: JobRef, _: Who, service: Svc) -> dict:
    """The job's GPU accounting: totals, each replica's, utilization over time."""
    return acct.job_usage(service, job_id, utcnow())


@router.get("/api/v1/accounting")
def accounting(_: Who, service: Svc,
               by: Literal["job", "team", "user", "day", "reservation"] = "job",
               since: datetime | None = None, until: datetime | None = None,
               team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
               job: Annotated[str | None, Query(max_length=200)] = None) -> dict:
    """GPU accounting over a window (default: the last 7 days), per job, per team or
    per day and team (Slurm's sacct, Grid Engine's qacct), or per admin's reservation
    (held, used and unused GPU-hours); `job` is an id, a unique id prefix or a job name,
    as everywhere."""
    if by == "reservation":
        from ...service import reservation_usage

        try:
            return reservation_usage.report(service, _aware(since), _aware(until), team,
                                            utcnow())
        except ValueError as exc:
            raise InputError(str(exc)) from None
    if job:
        from ...service.references import resolve_job

        job = resolve_job(service, job)
    try:
        return acct.report(service, by, _aware(since), _aware(until), team, job, utcnow())
    except ValueError as exc:
        raise InputError(str(exc)) from None
