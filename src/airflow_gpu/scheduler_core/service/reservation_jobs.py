"""The jobs admitted into a team reservation, as the reservation changes: its end is
their stop (admission: deadline_at = min(start + own limit, end)). Deleted, that stop is
lifted (their own time limit again); moved or shortened, it follows the new end. An
update of such a job's time limit may not take it past the reservation's end, as Slurm
refuses a job whose time limit passes its reservation's end."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import InputError
from ..jobclasses import resolve
from ..jobspec import JobSpec
from ..policy.scheduler import planned_runtime
from ..policy.windows import Window, at_most, too_long
from ..store.models import JobRow, ReservationRow
from ..units import format_duration
from .common import LIVE, PENDING, _ts, utcnow
from .uow import Store


def own_limit(svc: Store, job: JobRow) -> float | None:
    """The job's own time limit, seconds (its spec's, else its class's or the policy's;
    inf: none); None when its spec no longer resolves (its stop is left as it is)."""
    try:
        spec = resolve(JobSpec.model_validate({**job.spec, "name": job.id}),
                       svc.reg.job_classes, defaults=svc._policy().defaults)
    except (ValueError, TypeError, InputError):
        return None
    return float(spec.time_limit or math.inf)


def restop(svc: Store, s: Session, row: ReservationRow, why: str,
           gone: bool = False) -> None:
    """Set the stop of the live jobs admitted into `row` from its end (`gone`: it was
    deleted, so their own limit alone), with an event where it moves."""
    end = math.inf if gone else _ts(row.end_at)
    for job in s.scalars(select(JobRow).where(JobRow.reservation == row.name,
                                              JobRow.state.in_(LIVE))):
        own = own_limit(svc, job)
        if own is None or job.admitted_at is None:
            continue
        at = min(_ts(job.admitted_at) + own, end)
        was = _ts(job.deadline_at) if job.deadline_at is not None else math.inf
        if at == was or abs(at - was) < 1:        # (inf - inf is nan)
            continue
        job.deadline_at = None if at == math.inf else datetime.fromtimestamp(at, UTC)
        if at == math.inf:
            now = "it has no time limit"
        else:
            limit = format_duration(at - _ts(job.admitted_at))
            now = f"it is stopped at {_iso(at)} " + (
                f"(its reservation's end: time limit {limit})" if at == end
                else f"(its own time limit, {limit})")
        svc._event(s, "reservation", f"{why}: {now}", job=job.id)


def limit_refusal(svc: Store, job: JobRow, spec: JobSpec) -> str | None:
    """Why a new time limit (in `spec`, resolved) may not be given to a job of a
    reservation: it would take the job (running, or pending from its earliest start)
    past the reservation's end. None when it may (or the job asks for none)."""
    if job.reservation is None:
        return None
    with svc.reads() as s:
        row = s.get(ReservationRow, job.reservation)
    if row is None:
        return None                         # deleted: its end stops nothing any more
    limit, end = float(spec.time_limit or math.inf), _ts(row.end_at)
    fix = (f"or extend the reservation first (airflow-gpu reserve update {row.name} "
           "--end WHEN)")
    if job.state in LIVE and job.admitted_at is not None:
        most = end - _ts(job.admitted_at)
        if _ts(job.admitted_at) + limit <= end + 1:
            return None
        return (f"time_limit: {format_duration(limit)} would run job {job.id[:8]} past "
                f"the end of its reservation {row.name!r} ({_iso(end)}); it started "
                f"{_iso(_ts(job.admitted_at))}, so give a time limit of at most "
                f"{at_most(most)}, {fix}")
    if job.state == PENDING:                # as at submit, with the limit asked
        return runtime_refusal(svc, row, spec, limit)
    return None


def runtime_refusal(svc: Store, row: ReservationRow, spec: JobSpec,
                    asked: float | None = None) -> str | None:
    """Why a job (resolved) that asks for `row` can never end inside it: its planned
    runtime or the time limit it `asked` for, from the reservation's start or now,
    passes its end."""
    return too_long(_window(row), spec, planned_runtime(spec, svc._policy()),
                    _ts(utcnow()), _iso(_ts(row.end_at)), asked)


def _window(row: ReservationRow) -> Window:
    return Window(row.name, tuple(row.hosts), _ts(row.start_at), _ts(row.end_at),
                  frozenset(row.teams or ()), bool(row.maint))


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")
