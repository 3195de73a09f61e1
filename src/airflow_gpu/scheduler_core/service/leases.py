"""Lease checks: an admitted or running job whose launcher stopped heartbeating becomes
`lost`, one past its time limit and grace `timeout`, a backfilled one past its yield to a
reservation starts stopping (overrun.py), and a preempting job past its stop deadline
goes back to the queue; their resources return. The scheduling loop runs these
checks on a schedule of their own, apart from passes (loop.py), so a long pass never
delays them; only the leader runs them, each transaction fenced as a pass's is.

A lease measures the launcher against this process's own responsiveness: when this
process stalled while it led (frozen, starved of CPU; `StallClock`), the launchers may
not have reached it either, so every live lease is extended by the stall. Nothing else
extends a lease: not slow passes, not the time a replica spent as a follower."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from ..jobclasses import timeout_message
from ..store.bulk import update_rows
from ..store.models import JobRow
from .common import CHUNK, LIVE, QUIET, _ts, _update, release_many, utcnow
from .overrun import STOPPABLE, stop_overrunners
from .uow import Store

log = logging.getLogger(__name__)


class StallClock:
    """This process's stalls, on its monotonic clock: `run` notes the time every `every`
    seconds; a gap between two notes over `threshold` is a stall, added up until `take`.
    Where `run` does not run (passes by hand), the gap between two checks counts."""

    def __init__(self, threshold: float, every: float | None = None):
        self.threshold = threshold
        self.every = every or max(0.01, min(0.25, threshold / 4))
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._stalled = 0.0

    def note(self) -> None:
        with self._lock:
            now = time.monotonic()
            gap, self._last = now - self._last, now
            if gap > self.threshold:
                self._stalled += gap

    def take(self) -> float:
        """Seconds this process stalled since the last take (or reset)."""
        self.note()
        with self._lock:
            stalled, self._stalled = self._stalled, 0.0
        return stalled

    def reset(self) -> None:
        """Forget what came before (this replica has just gained the lead)."""
        with self._lock:
            self._last, self._stalled = time.monotonic(), 0.0

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.every):
            self.note()


_NO_LEAD = object()   # no check ran under this replica's current lead yet


class LeaseChecks:
    """The scheduling loop's lease checks: every `every` seconds on a thread of their own,
    by the leader only (`loop.token`, `loop.fence`), with a stall clock of their own."""

    def __init__(self, loop):
        ttl = loop.service.settings.lease_ttl
        self.loop = loop
        self.stalls = StallClock(ttl / 3)
        self.every = min(loop.interval, ttl / 6, 1.0)
        self._led: object = _NO_LEAD      # the lead the last check ran under

    def threads(self, stop: threading.Event, check: Callable[[], object],
                failed: Callable[[Exception], None]) -> list[threading.Thread]:
        """The stall clock's thread and the one that calls `check` every `every` seconds
        (`failed(exc)` hears what it raised)."""
        def checks() -> None:
            while not stop.wait(self.every):
                try:
                    check()
                except Exception as exc:  # noqa: BLE001 - the next check retries
                    failed(exc)

        self.stalls.reset()
        return [threading.Thread(target=self.stalls.run, args=(stop,), name="stall-clock",
                                 daemon=True),
                threading.Thread(target=checks, name="lease-checks", daemon=True)]

    def once(self) -> list[str]:
        """One check, by the leader only (fenced like a pass); returns the jobs it ended.
        Extends live leases by this process's stalls since this replica gained the lead,
        never by the time it did not lead."""
        loop = self.loop
        token = loop.token
        if loop._elected and token is None:      # not leading now
            self._led = _NO_LEAD
            return []
        if self._led != token:                   # a new lead: nothing before it counts
            self._led = token
            self.stalls.reset()
        now = utcnow()            # first: a freeze after it only makes the check lenient
        ended = check(loop.service, now, self.stalls.take(), loop.fence)
        if loop.metrics:
            loop.metrics.lease_expiries.inc(len(ended))
        return ended


def due(svc: Store, now: datetime) -> bool:
    """Whether a check may have anything to do (a read: on SQLite it never waits for a
    pass's write lock)."""
    with svc.reads() as s:
        return s.execute(select(JobRow.id).where(or_(
            and_(JobRow.state.in_(LIVE), JobRow.lease_expires_at < now),
            and_(JobRow.state.in_(LIVE), JobRow.deadline_at < now),
            and_(JobRow.state.in_(STOPPABLE), JobRow.yield_at < now),
            and_(JobRow.state == "preempting", JobRow.preempt_deadline_at < now)))
            .limit(1)).first() is not None


def check(svc: Store, now: datetime, stall: float = 0.0,
          fence: Callable[[Session], None] | None = None) -> list[str]:
    """One lease check at `now`, after this process stalled `stall` seconds while it led;
    returns the jobs that ended (lost or timed out)."""
    if not stall and not due(svc, now):
        return []
    from .preemption import requeue_overdue

    with svc.sessions.begin() as s:
        if fence is not None:     # first: still the leader, or this check writes nothing
            fence(s)
        ended = _time_out(svc, s, now)
        stop_overrunners(svc, s, now)
        requeue_overdue(svc, s, now)
        if stall:
            _extend(s, stall)
        # in bulk: when many launchers fall behind at once (a busy server, a network
        # split), one statement per job would slow the server further behind them
        expired = list(s.scalars(select(JobRow.id).where(
            JobRow.state.in_(LIVE), JobRow.lease_expires_at < now).order_by(JobRow.id)))
        for k in range(0, len(expired), CHUNK):
            lost = list(s.scalars(_update(JobRow).where(
                JobRow.id.in_(expired[k:k + CHUNK]), JobRow.state.in_(LIVE),
                JobRow.lease_expires_at < now).values(
                state="lost", finished_at=now, outcome="lost", lease_expires_at=None)
                .returning(JobRow.id)))
            release_many(s, lost)
            for job_id in sorted(lost):
                svc._event(s, "lost", "lease expired: no heartbeat from the launcher "
                           f"for {svc.settings.lease_ttl:g}s", job=job_id)
            ended += sorted(lost)
    if ended:
        svc.wake.set(freed=True)
    return ended


def _extend(s: Session, stall: float) -> None:
    log.warning("this process stalled for %.1fs while it led (frozen or starved of CPU): "
                "live jobs' leases are extended by that much instead of expiring", stall)
    by = timedelta(seconds=stall)
    rows = [{"id": job_id, "lease_expires_at": expires + by}
            for job_id, expires in s.execute(select(JobRow.id, JobRow.lease_expires_at).where(
                JobRow.state.in_(LIVE), JobRow.lease_expires_at.is_not(None)))]
    if rows:          # in one statement; a lease write, which the leader does not read
        update_rows(s.connection(), JobRow.__table__, ("id",), rows, {"rev": QUIET},
                    where=(JobRow.state.in_(LIVE),))


def _time_out(svc: Store, s: Session, now: datetime) -> list[str]:
    """End the live jobs past their time limit and grace: their launcher should have
    stopped them at the limit (and said so); whether it did or is gone, their GPUs
    return now."""
    ended = []
    rows = list(s.execute(select(JobRow.id, JobRow.deadline_at, JobRow.stop_grace,
                                 JobRow.admitted_at).where(
        JobRow.state.in_(LIVE), JobRow.deadline_at < now)))
    for job_id, deadline, grace, admitted in rows:
        if _ts(deadline) + (grace or 0) >= _ts(now):
            continue
        done = s.execute(_update(JobRow).where(
            JobRow.id == job_id, JobRow.state.in_(LIVE)).values(
            state="timeout", finished_at=now, outcome="timeout", lease_expires_at=None))
        if done.rowcount == 1:
            svc._release(s, job_id)
            limit = _ts(deadline) - _ts(admitted)
            svc._event(s, "timeout", timeout_message(limit, grace or 0)
                       + "; its resources are released", job=job_id)
            ended.append(job_id)
    return ended
