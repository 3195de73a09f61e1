"""What admins' reservations do to the store as time passes, each pass (leader only):
a maintenance reservation drains its hosts at its start and resumes them at its end;
pending jobs that asked for a reservation that ended (or was deleted) are cancelled;
the windows the engine plans with (windows.py). And, when a reservation is made or
changed, the running jobs on its hosts that it would stop: warned in their events, told
to their launchers (`yield_reservation`), stopped and requeued at its start if still
running (overrun.py)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..jobclasses import resolve
from ..jobspec import JobSpec
from ..policy.scheduler import planned_runtime
from ..policy.windows import Window
from ..store.models import AllocationRow, HostRow, JobRow, ReservationRow
from ..units import format_duration
from .common import LIVE, PENDING, _ts, _update, utcnow
from .reservation_jobs import restop, runtime_refusal
from .uow import Store

DRAINED_BY = "reservation "      # HostRow.drained_by of the hosts a reservation drained


def apply(svc: Store, s: Session, now: datetime) -> list[Window]:
    """Drain and resume hosts as maintenance windows start and end, cancel pending jobs
    whose reservation is gone; returns the windows that have not ended, for the pass."""
    t = _ts(now)
    rows = list(s.scalars(select(ReservationRow)))
    live = {}
    for row in rows:
        active = _ts(row.start_at) <= t < _ts(row.end_at)
        want = set(row.hosts) if active and row.maint else set()
        had = set(row.drained or ())
        if want != had:
            _drain(svc, s, row, want - had, now)
            _resume(svc, s, row, had - want)
            row.drained = sorted(_drained_by(s, row))
        if _ts(row.end_at) > t:
            live[row.name] = row
    for job in list(s.scalars(select(JobRow).where(JobRow.state == PENDING,
                                                   JobRow.reservation.is_not(None)))):
        if job.reservation not in live:
            _cancel(svc, s, job, f"its reservation {job.reservation!r} has ended (or does "
                    "not exist)", now)
    return [Window(r.name, tuple(r.hosts), _ts(r.start_at), _ts(r.end_at),
                   frozenset(r.teams or ()), bool(r.maint)) for r in live.values()]


def skip_drain(host: HostRow, windows: list[Window], t: float) -> bool:
    """A host a maintenance window drained: the pass holds it through the window instead
    (as the simulator does), so both plan alike."""
    return bool(host.drained_by and host.drained_by.startswith(DRAINED_BY) and any(
        w.maint and host.name in w.hosts and w.start <= t < w.end for w in windows))


def _drained_by(s: Session, row: ReservationRow) -> set[str]:
    return set(s.scalars(select(HostRow.name).where(
        HostRow.drained.is_(True), HostRow.drained_by == DRAINED_BY + row.name)))


def _drain(svc: Store, s: Session, row: ReservationRow, hosts: set[str], now: datetime
           ) -> None:
    why = f"maintenance reservation {row.name} until {row.end_at.isoformat(timespec='seconds')}"
    for h in sorted(hosts):
        host = s.get(HostRow, h)
        if host is None or host.drained:      # drained already: its admin's reason stays
            continue
        host.drained, host.drain_reason, host.drained_at = True, why, now
        host.drained_by = DRAINED_BY + row.name
        svc._event(s, "host", f"host {h} drained: {why} starts", host=h)


def _resume(svc: Store, s: Session, row: ReservationRow, hosts: set[str]) -> None:
    for h in sorted(hosts):
        host = s.get(HostRow, h)
        if host is None or host.drained_by != DRAINED_BY + row.name:
            continue                          # resumed or drained again by an admin
        host.drained, host.drain_reason = False, None
        host.drained_at = host.drained_by = None
        svc._event(s, "host", f"host {h} resumed: maintenance reservation {row.name} "
                   "ended", host=h)


def _cancel(svc: Store, s: Session, job: JobRow, why: str, now: datetime) -> None:
    done = s.execute(_update(JobRow).where(JobRow.id == job.id, JobRow.state == PENDING)
                     .values(state="cancelled", finished_at=now, outcome="cancelled",
                             reason_code="Reservation", reason=why))
    if done.rowcount == 1:
        svc._event(s, "cancelled", f"cancelled: {why}", job=job.id)


def end_reservation(svc: Store, s: Session, row: ReservationRow, now: datetime,
                    why: str) -> None:
    """A reservation goes: its drained hosts resume, its yields are lifted, its running
    jobs are stopped by their own time limit again (not its end), the pending jobs that
    asked for it are cancelled."""
    _resume(svc, s, row, set(row.drained or ()))
    restop(svc, s, row, f"{why}: its end no longer stops this job", gone=True)
    for job in s.scalars(select(JobRow).where(JobRow.yield_reservation == row.name,
                                              JobRow.state.in_(LIVE))):
        job.yield_at = job.yield_reservation = None
        svc._event(s, "reservation", f"{why}: it no longer stops this job", job=job.id)
    for job in list(s.scalars(select(JobRow).where(JobRow.state == PENDING,
                                                   JobRow.reservation == row.name))):
        _cancel(svc, s, job, why, now)


def warn_jobs(svc: Store, s: Session, row: ReservationRow) -> list[dict]:
    """The live jobs on the reservation's hosts that may still run at its start (their
    own limit ends later): each yields then (stopped and requeued, overrun.py), and is
    told so in its events; those expected to run past the start are returned, for the
    admin. A job that asked for this reservation is its own."""
    start, hosts = _ts(row.start_at), set(row.hosts)
    for job in s.scalars(select(JobRow).where(JobRow.yield_reservation == row.name)):
        job.yield_at = job.yield_reservation = None        # planned again below
    on = {a.job_id for a in s.scalars(select(AllocationRow).where(
        AllocationRow.live.is_(True), AllocationRow.host.in_(hosts)))}
    if not on:
        return []
    policy, named = svc._policy(), []
    for job in s.scalars(select(JobRow).where(JobRow.id.in_(on), JobRow.state.in_(LIVE))):
        if job.reservation == row.name:
            continue
        limit = _ts(job.deadline_at) if job.deadline_at is not None else math.inf
        if limit <= start:
            continue                  # its own limit stops it first
        if job.yield_at is not None and _ts(job.yield_at) <= start:
            continue                  # it yields to another reservation first
        job.yield_at = datetime.fromtimestamp(start, UTC)
        job.yield_reservation = row.name
        end = _expected_end(svc, job, policy)
        if end > start:
            named.append({"id": job.id, "name": job.name, "team": job.team,
                          "array_index": job.array_index,
                          "state": job.state, "expected_end": _iso(end),
                          "deadline": _iso(limit)})
        kind = "maintenance reservation" if row.maint else "reservation"
        svc._event(s, "reservation", (
            f"{kind} {row.name} on {', '.join(sorted(hosts & _hosts_of(s, job.id)))} "
            f"starts at {row.start_at.isoformat(timespec='seconds')}; this job is expected to end "
            f"{_iso(end) or 'never'}: if it still runs then, it is stopped (its class's "
            "signal and grace) and requeued under the same id"), job=job.id)
    return named


def _hosts_of(s: Session, job_id: str) -> set[str]:
    return set(s.scalars(select(AllocationRow.host).where(
        AllocationRow.job_id == job_id, AllocationRow.live.is_(True))))


def _expected_end(svc: Store, job: JobRow, policy) -> float:
    if job.admitted_at is None:
        return math.inf
    try:
        spec = resolve(JobSpec.model_validate({**job.spec, "name": job.id}),
                       svc.reg.job_classes, defaults=policy.defaults)
    except (ValueError, TypeError):
        return math.inf
    return _ts(job.admitted_at) + planned_runtime(spec, policy)


def _iso(t: float) -> str | None:
    return None if t == math.inf else datetime.fromtimestamp(t, UTC).isoformat(timespec='seconds')


def yield_note(name: str, left: float) -> str:
    """What an admission event says of a job that backfills ahead of a reservation."""
    return (f"; it backfills ahead of reservation {name}: if it runs past its expected "
            f"runtime into it (in {format_duration(max(0, left))}), it is stopped and "
            "requeued under the same id")


def reservation_refusal(svc: Store, spec: JobSpec, asked_limit: float | None = None
                        ) -> str | None:
    """Why a job that asks for a reservation can never run in it, else None: the
    reservation is gone, not its team's, cannot hold it, or ends before the job would
    (its planned runtime or the time limit it asked for)."""
    from ..engine.placement import compile_needs, never_fits
    from ..policy.windows import confined

    name = spec.reservation
    with svc.reads() as s:
        row = s.get(ReservationRow, name)
    if row is None or _ts(row.end_at) <= _ts(utcnow()):
        return (f"reservation: {name!r} is no reservation that has not ended (airflow-gpu "
                "reserve list shows them); ask an admin for one, or leave reservation out")
    if row.maint:
        return (f"reservation: {name!r} is a maintenance reservation, in which no job runs;"
                " leave reservation out")
    if spec.team not in (row.teams or ()):
        return (f"reservation: {name!r} is for team{'s' if len(row.teams) > 1 else ''} "
                f"{', '.join(row.teams)}, not {spec.team!r}; submit as one of them, or "
                "leave reservation out")
    w = Window(row.name, tuple(row.hosts), _ts(row.start_at), _ts(row.end_at),
               frozenset(row.teams), False)
    why = never_fits(confined(spec, w), svc._empty, svc.reg, compile_needs(spec))
    if why is not None:
        return f"reservation: {name!r} ({', '.join(row.hosts)}) cannot hold it: {why}"
    return runtime_refusal(svc, row, spec, asked_limit)
