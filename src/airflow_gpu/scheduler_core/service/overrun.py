"""Backfilled jobs that overrun. A job backfilled ahead of a reservation was planned, by
its expected runtime, to end before the reserved job starts; one still running then
yields: it is stopped like a preempted job (its class's signal, and the grace it was
admitted with, which the reserved job's promise counts) and requeued under the same id
once its replicas have stopped (preemption.requeue). Where the reserved job no longer
waits (it was cancelled, or started elsewhere), nothing needs the resources: the job runs
on. An estimate never ends a job `timeout`; only the job's own time_limit does
(leases.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..store.models import JobRow, ReservationRow
from ..units import format_duration
from .common import PENDING, _ts, _update, stop_options, stopping
from .uow import Store

OVERRAN = "overran its expected runtime"     # preempt_reason of such a stop (requeue)
WINDOW = "reservation "       # ... and of a stop for an admin's reservation (its name next)
STOPPABLE = ("admitted", "running")


def stop_overrunners(svc: Store, s: Session, now: datetime) -> list[str]:
    """Start stopping the live jobs past their yield (in the lease check's fenced
    transaction `s`); returns them."""
    stopped = []
    for row in list(s.scalars(select(JobRow).where(
            JobRow.state.in_(STOPPABLE), JobRow.yield_at < now))):
        window = s.get(ReservationRow, row.yield_reservation) \
            if row.yield_reservation else None
        if window is None and s.scalar(select(JobRow.state).where(
                JobRow.id == row.limit_cut_by)) != PENDING:
            # the reserved job no longer waits, or the admin's reservation went
            s.execute(_update(JobRow).where(JobRow.id == row.id).values(
                yield_at=None, yield_reservation=None))
            continue
        spec, sig, _ = stop_options(svc.reg.job_classes, svc._policy(), row.spec, row.id)
        expected = spec.expected_runtime if spec else None
        grace = row.stop_grace or 0      # what the reserved job's promise counted
        ran = _ts(now) - _ts(row.admitted_at) if row.admitted_at else 0.0
        if window is not None:
            kind = f"maintenance {WINDOW}" if window.maint else WINDOW
            at = window.start_at.isoformat(timespec="seconds")
            why = (f"{kind}{window.name} starts on its hosts (at {at}; it ran "
                   f"{format_duration(ran)})")
        else:
            why = (f"{OVERRAN}{f' of {format_duration(expected)}' if expected else ''} "
                   f"(ran {format_duration(ran)}) into the reservation of job "
                   f"{row.limit_cut_by[:8]}, which it backfilled ahead of")
        done = s.execute(_update(JobRow).where(
            JobRow.id == row.id, JobRow.state.in_(STOPPABLE),
            JobRow.attempt == row.attempt).values(**stopping(why, sig, grace, now)))
        if done.rowcount == 1:
            svc._event(s, "overrun", f"stopping: {'' if window else 'it '}{why}; sending "
                       f"{sig}, SIGKILL after {format_duration(grace)}; it is requeued "
                       "under the same id once its replicas have stopped"
                       + ("" if window else " (an estimate never ends a job; its own "
                          "time_limit would)"), job=row.id)
            stopped.append(row.id)
    return stopped

