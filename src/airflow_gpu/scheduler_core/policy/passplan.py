"""The reservations of one pass: those it makes, those carried over from the last pass,
the last pass's that still stand (reused instead of walked again), and their holds on
the live state.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from ..engine.placement import Placed
from .reservations import Hold, Reservation

if TYPE_CHECKING:
    from .types import QueuedJob, SchedulerView


class PassPlan:
    def __init__(self, sched: SchedulerView, now: float):
        self.s, self.now = sched, now
        epoch, last, stood, carried_before = sched._planned
        self.planned = {r.job.name: r for r in stood}  # the last pass's, by job
        # a job waiting for locality keeps its reservation until it is considered again,
        # so that smaller jobs ahead of it in this pass do not take it
        self.carried = {r.job.name: r for r in stood if not r.protected and r.start > now}
        self.had_carried = bool(self.carried)
        self.reservations = sorted(self.carried.values(), key=lambda r: r.start)  # by start
        self.made: list[Reservation] = []              # in the order they were made
        # reservations carried over change what the last pass's walks went around
        reuse = (epoch == sched.plan_epoch() and sched.reuse_reservations
                 and not self.carried and not carried_before)
        self.last = last if reuse else []
        self.next_last = 0                             # how far the last pass's still stand
        self._held: list[Hold] = []                    # holds of reservations[:len(_held)]

    def starts(self) -> list[float]:
        return [r.start for r in self.reservations]

    def hold_first(self, k: int) -> None:
        """Hold exactly the first `k` reservations (by start) on the live state."""
        state = self.s.state
        while len(self._held) > k:
            self._held.pop().drop(state)
        while len(self._held) < k:
            hold = Hold(self.reservations[len(self._held)].allocations)
            hold.grab(state)
            self._held.append(hold)

    def add(self, r: Reservation) -> None:
        i = bisect.bisect_right(self.starts(), r.start)
        self.hold_first(min(i, len(self._held)))
        self.reservations.insert(i, r)
        self.made.append(r)

    def drop_carried(self, job: QueuedJob) -> bool:
        """The job is considered again: its carried reservation goes (True if it had one)."""
        r = self.carried.pop(job.name, None)
        if r is None:
            return False
        i = next(k for k, x in enumerate(self.reservations) if x is r)
        self.hold_first(min(i, len(self._held)))
        del self.reservations[i]
        return True

    def due_now(self, job: QueuedJob) -> Placed | None:
        """The job's reservation from the last pass, if its time has come and it is free:
        the job starts exactly where it was promised."""
        r = self.planned.get(job.name)
        if r is None or r.start > self.now:
            return None
        self.hold_first(0)
        if not r.is_free(self.s.state):
            return None
        end = self.now + self.s.runtime(job, r.tier)
        if any(x.start < end and x.overlaps(r.allocations) for x in self.reservations):
            return None
        return Placed(r.allocations)

    def still_standing(self, job: QueuedJob, started: list[tuple[QueuedJob, Placed]]
                       ) -> Reservation | None:
        """The job's reservation from the last pass, if a new walk would find the same.

        The last pass's reservations stand in order while each is for the same job and
        still ahead, the ones before it stood too (or their jobs started on them),
        nothing came back earlier or later than planned and the time model did not change
        (`Scheduler.plan_epoch`), no job past its planned end holds part of it, and no
        job started in this pass touches it before it ends. Nothing else can move it:
        every other change only takes resources, and backfill only takes reserved ones
        until the reservation starts."""
        placed = {j.name: p for j, p in started}
        last = self.last
        while self.next_last < len(last) and last[self.next_last].job.name in placed:
            r = last[self.next_last]
            if placed[r.job.name].allocations is not r.allocations:
                break            # it started elsewhere: what came after was planned around it
            self.next_last += 1
        if self.next_last < len(last):
            r = last[self.next_last]
            state = self.s.state
            if r.job is job and r.start > self.now and not any(
                    state.expected_end[j.name] > r.start and r.overlaps(p.allocations)
                    for j, p in started) and not self._overdue_under(r):
                self.next_last += 1
                return r
        self.last = []
        return None

    def _overdue_under(self, r: Reservation) -> bool:
        """A job past its planned end holds part of `r`: its end is re-estimated each pass."""
        state = self.s.state
        for end, name in state.ends():
            if end > self.now:
                return False
            if r.overlaps(state.allocations[name]):
                return True
        return False
