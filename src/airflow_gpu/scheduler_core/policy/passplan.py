"""The reservations of one pass: those it makes, those carried over from the last pass,
the last pass's that still stand (reused instead of walked again), and their holds on
the live state.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from ..engine.placement import Placed
from .reservations import Hold, Reservation
from .windows import hold as window_hold

if TYPE_CHECKING:
    from ..engine.state import ReplicaAllocation
    from .types import QueuedJob, SchedulerView


class PassPlan:
    def __init__(self, sched: SchedulerView, now: float):
        self.s, self.now = sched, now
        epoch, last, stood, carried_before = sched._planned
        self.planned = {r.job.name: r for r in stood}  # the last pass's, by job
        # a job waiting for locality keeps its reservation until it is considered again,
        # so that smaller jobs ahead of it in this pass do not take it
        self.carried = {r.job.name: r for r in stood
                        if not r.protected and r.carry and r.start > now}
        self.had_carried = bool(self.carried)
        # the admins' reservations that have not ended hold their hosts (windows.py)
        self.windows = {w.name: window_hold(w, sched.state) for w in sched.windows.values()
                        if w.end > now}
        self.reservations = sorted([*self.windows.values(), *self.carried.values()],
                                   key=lambda r: r.start)  # by start
        self._starts = [r.start for r in self.reservations]
        self.made: list[Reservation] = []              # in the order they were made
        # reservations carried over change what the last pass's walks went around
        reuse = (epoch == sched.plan_epoch() and sched.reuse_reservations
                 and not self.carried and not carried_before)
        self.last = last if reuse else []
        self.next_last = 0                             # how far the last pass's still stand
        self._held: list[Hold] = []                    # holds of reservations[:len(_held)]
        # the pass holds the first `_asked` of them (hold_first); the rest stay taken
        # until a placement needs fewer, as the next one mostly asks for them all again
        # (while they stay, only holds change the state: nothing else reads it but
        # usable_total, which counts them out)
        self._asked = 0
        # each hold's hosts as they were before it took from them (_free_on), and the
        # holds dropped: where their hosts are as they were then, taken again as they
        # were (what a hold takes depends on nothing else)
        self._before: dict[Hold, tuple] = {}
        self._kept: dict[Reservation, tuple[Hold, list, tuple]] = {}
        self._gpus: dict[Hold, list] = {}     # each hold's pieces that hold GPUs
        self._on_host: dict[int, list[Reservation]] = {}   # the reservations on each host
        for r in self.reservations:
            self._index(r, 1)

    @staticmethod
    def _hosts(r: Reservation) -> dict[int, None]:
        return dict.fromkeys(a.host.index for a in r.allocations)

    def _index(self, r: Reservation, sign: int) -> None:
        for host in self._hosts(r):
            if sign > 0:
                self._on_host.setdefault(host, []).append(r)
            else:
                self._on_host[host].remove(r)

    def blocks(self, allocs: list[ReplicaAllocation], end: float,
               ignore: Reservation | None = None) -> bool:
        """Some reservation (but `ignore`) that starts before `end` holds part of
        `allocs`."""
        on_host = self._on_host
        for host in {a.host.index for a in allocs}:
            for r in on_host.get(host, ()):
                if r.start < end and r is not ignore and r.overlaps(allocs):
                    return True
        return False

    def overlapping(self, allocs: list[ReplicaAllocation]) -> list[Reservation]:
        """The reservations that hold part of `allocs` (looked up by host)."""
        found = {id(r): r for host in {a.host.index for a in allocs}
                 for r in self._on_host.get(host, ()) if r.overlaps(allocs)}
        return list(found.values())

    def holds_all(self) -> bool:
        return len(self._held) == len(self.reservations)

    def starts(self) -> list[float]:
        """The reservations' starts, in their order (a live view: do not mutate)."""
        return self._starts

    def hold_first(self, k: int) -> None:
        """Hold exactly the first `k` reservations (by start) on the live state."""
        while len(self._held) > k:
            self._drop()
        while len(self._held) < k:
            self._held.append(self._grab(self.reservations[len(self._held)]))
        self._asked = k

    def _free_on(self, hold: Hold) -> tuple:
        """What is free on the hold's hosts, all that Hold.grab reads of them."""
        hosts = self.s.state.hosts
        return tuple((hs.free_gpus, hs.free_slices, tuple(hs.free_cpus), tuple(hs.free_mem))
                     for hs in map(hosts.__getitem__, hold.want))

    def _grab(self, r: Reservation) -> Hold:
        state = self.s.state
        kept = self._kept.pop(r, None)
        if kept is not None and self._free_on(kept[0]) == kept[2]:
            # its hosts are as they were before it was taken: it takes the same again
            hold, pieces, before = kept
            for piece in pieces:
                state.hold(piece)
            hold.pieces.extend(pieces)
        else:
            hold = Hold(r.allocations)
            before = self._free_on(hold)
            hold.grab(state)
        self._before[hold] = before
        self._gpus[hold] = [piece for piece in hold.pieces if piece.gpu_mask]
        return hold

    def _drop(self) -> None:
        hold = self._held.pop()
        r = self.reservations[len(self._held)]
        del self._gpus[hold]
        pieces = list(hold.pieces)
        hold.drop(self.s.state)
        self._kept[r] = (hold, pieces, self._before.pop(hold))

    def let_go(self) -> None:
        """The pass holds nothing now, but the holds stay until a placement asks for
        fewer (hold_first): most of the time it asks for them all again next."""
        self._asked = 0

    def ask(self, k: int) -> int:
        """Hold the first `k` reservations, those after them kept until a placement needs
        the state (hold_first); returns the GPUs usable with the first `k` held."""
        if k > len(self._held):
            self.hold_first(k)
        self._asked = k
        return self.usable_total()

    def usable_total(self) -> int:
        """Usable GPUs with the holds the pass asked for: the holds kept beyond them
        count as given back."""
        state = self.s.state
        n = state.usable_total
        for hold in self._held[self._asked:]:
            for piece in self._gpus[hold]:
                hs = state.hosts[piece.host.index]
                if not hs.drained:
                    n += (piece.gpu_mask & ~hs.bad_gpus).bit_count()
        return n

    def add(self, r: Reservation) -> None:
        i = bisect.bisect_right(self.starts(), r.start)
        held = len(self._held)
        after = {id(x) for x in self.reservations[i:held]}
        if after and not any(id(x) in after for h in self._hosts(r)
                             for x in self._on_host.get(h, ())):
            # the holds after it are on other hosts, so its hold takes now what it would
            # have taken before theirs: they stay
            self._held.insert(i, self._grab(r))
        else:
            self._held_to(min(i, held))
        self._asked = min(i, self._asked)
        self.reservations.insert(i, r)
        self._starts.insert(i, r.start)
        self.made.append(r)
        self._index(r, 1)

    def _held_to(self, k: int) -> None:
        """hold_first(k) for k <= len(_held), what the pass asked for left as it is."""
        asked = self._asked
        self.hold_first(k)
        self._asked = min(k, asked)

    def drop_carried(self, job: QueuedJob) -> bool:
        """The job is considered again: its carried reservation goes (True if it had one)."""
        r = self.carried.pop(job.name, None)
        if r is None:
            return False
        i = next(k for k, x in enumerate(self.reservations) if x is r)
        self._held_to(min(i, len(self._held)))
        del self.reservations[i], self._starts[i]
        self._index(r, -1)
        self._kept.pop(r, None)
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
        if self.blocks(r.allocations, self.now + self.s.runtime(job, r.tier)):
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
