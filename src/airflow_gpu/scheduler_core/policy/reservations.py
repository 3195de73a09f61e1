"""Reservations: specific hosts, GPUs, cores and memory promised to a job at a time.

A reservation is protected by a `Hold`: the parts of its resources that are free are
taken from the live state (without a job), so `place` goes around them. Holds and the
walk change the live state only between a call and its undo; the state is exactly as
before when they return.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.placement import Placed, place
from ..engine.state import ClusterState, ReplicaAllocation
from .timemodel import reestimate

if TYPE_CHECKING:
    from ..plugins import Registry
    from .types import QueuedJob


@dataclass(eq=False)
class Reservation:
    job: QueuedJob
    start: float
    end: float                          # start + estimate x the placement's slowdown
    allocations: list[ReplicaAllocation]
    tier: int = 0                       # 0 one host, 1 one switch, 2 across switches
    protected: bool = False             # the wait guarantee's (else: waits for locality)
    # not protected: held in the next pass until its job is considered again (a wait for
    # locality); not an urgent job's (slack.py): only jobs with less slack come before it
    carry: bool = True
    # where `start` was moved up to the job's first promise (a job in its way overran):
    # when the walk expects it to start
    eta: float | None = None
    # an admin's window (windows.WindowHold): its end is a time the walk tries, as a
    # running job's end is (a job's own reservation ends only when that job does)
    frees_hosts = False

    @property
    def planned_start(self) -> float:
        return self.start if self.eta is None else self.eta

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(a.host.name for a in self.allocations))

    @functools.cached_property
    def _held(self) -> dict[int, tuple[int, dict[int, int]]]:
        """Per host index: the GPU mask and the CPU masks per NUMA position it holds."""
        mine: dict[int, tuple[int, dict[int, int]]] = {}
        for a in self.allocations:
            g, cpus = mine.get(a.host.index, (0, {}))
            for p, m in a.cpu_masks:
                cpus[p] = cpus.get(p, 0) | m
            mine[a.host.index] = (g | a.gpu_mask, cpus)
        return mine

    @functools.cached_property
    def _held_slices(self) -> dict[int, int]:
        """Per host index: the MIG devices it holds."""
        mine: dict[int, int] = {}
        for a in self.allocations:
            if a.slice_mask:
                mine[a.host.index] = mine.get(a.host.index, 0) | a.slice_mask
        return mine

    def overlaps(self, allocs: list[ReplicaAllocation]) -> bool:
        """Whether `allocs` take any GPU or core this reservation holds."""
        mine = self._held
        for a in allocs:
            if a.host.index not in mine:
                continue
            g, cpus = mine[a.host.index]
            if a.gpu_mask & g or any(m & cpus.get(p, 0) for p, m in a.cpu_masks):
                return True
            if a.slice_mask & self._held_slices.get(a.host.index, 0):
                return True
        return False

    def is_free(self, state: ClusterState) -> bool:
        """Whether all of its resources are free in `state` now."""
        need: dict[int, list[ReplicaAllocation]] = {}
        for a in self.allocations:
            need.setdefault(a.host.index, []).append(a)
        for i, allocs in need.items():
            hs = state.hosts[i]
            gpus = sum(a.gpu_mask for a in allocs)
            if gpus & ~hs.usable_gpus:
                return False
            if sum(a.slice_mask for a in allocs) & ~hs.usable_slices:
                return False
            cpus: dict[int, int] = {}
            mem: dict[int, int] = {}
            for a in allocs:
                for p, m in a.cpu_masks:
                    cpus[p] = cpus.get(p, 0) | m
                for p, b in a.mem:
                    mem[p] = mem.get(p, 0) + b
            if any(m & ~hs.free_cpus[p] for p, m in cpus.items()) or any(
                    b > hs.free_mem[p] for p, b in mem.items()):
                return False
        return True


class Hold:
    """Takes a reservation's resources from the state as they come free; `drop` returns them."""

    def __init__(self, allocations: list[ReplicaAllocation]):
        # still to take, per host and replica:
        # [alloc, gpu mask, {numa: cpus}, {numa: bytes}, MIG slot mask]
        self.want: dict[int, list[list]] = {}
        for a in allocations:
            self.want.setdefault(a.host.index, []).append(
                [a, a.gpu_mask, dict(a.cpu_masks), dict(a.mem), a.slice_mask])
        self.pieces: list[ReplicaAllocation] = []

    def grab(self, state: ClusterState, host: int | None = None) -> None:
        for wants in self.want.values() if host is None else (self.want.get(host, ()),):
            for w in wants:
                a, gpus, cpus, mem, slots = w
                hs = state.hosts[a.host.index]
                g = gpus & hs.free_gpus
                sl = slots & hs.free_slices
                c = [(p, m & hs.free_cpus[p]) for p, m in cpus.items() if m & hs.free_cpus[p]]
                b = [(p, min(n, hs.free_mem[p])) for p, n in mem.items()
                     if n and hs.free_mem[p] > 0]
                if not (g or c or b or sl):
                    continue
                piece = ReplicaAllocation(a.job, a.role, a.index, a.host, g, c, b,
                                          slice_mask=sl)
                state.hold(piece)
                self.pieces.append(piece)
                w[1] = gpus & ~g
                w[4] = slots & ~sl
                for p, m in c:
                    cpus[p] &= ~m
                for p, n in b:
                    mem[p] -= n

    def drop(self, state: ClusterState) -> None:
        for piece in reversed(self.pieces):
            state.unhold(piece)
        self.pieces.clear()


def could_fit(job: QueuedJob, state: ClusterState) -> bool:
    """A cheap necessary condition (GPU counts only) before trying `place`."""
    if state.usable_total < job.gpus:
        return False
    return all(state.replica_capacity(n.gpus) >= n.replicas for n in job.needs if n.gpus)


def place_best(job: QueuedJob, state: ClusterState, reg: Registry, best_tier: int,
               cap: int = 2) -> Placed | None:
    """The job placed now at the lowest slowdown tier it can get (up to `cap`), or None.

    `place` puts a gang on the fewest hosts first; when that costs a wider tier than the
    job could have, one more try looks for a placement within the tier below."""
    if not could_fit(job, state):
        return None
    got = place(job.spec, state, reg, job.needs, within=cap if cap < 2 else None)
    if not isinstance(got, Placed):
        return None
    if got.tier > best_tier:
        tighter = place(job.spec, state, reg, job.needs, within=got.tier - 1)
        if isinstance(tighter, Placed):
            return tighter
    return got


def running_ends(state: ClusterState, now: float) -> list[tuple[float, str]]:
    """Running jobs by expected end, soonest first; jobs past their planned end are
    re-estimated (`timemodel.reestimate`), never past their time limit and grace."""
    ends = state.ends()
    k = 0
    while k < len(ends) and ends[k][0] <= now:
        k += 1
    if not k:
        return list(ends)
    hard = state.hard_end
    late = sorted((min(reestimate(state.started[name], end, now),
                       max(hard.get(name, math.inf), now)), name) for end, name in ends[:k])
    # two sorted runs of distinct (end, name): one sort merges them, in C
    return sorted(late + ends[k:])


def earliest_end(job: QueuedJob, state: ClusterState, reg: Registry, now: float,
                 reservations: list[Reservation], runtime: Callable[[int], float],
                 best_tier: int, candidate: Reservation | None = None,
                 tried: list | None = None, start_by: float = math.inf
                 ) -> Reservation | None:
    """The placement with the earliest expected end, from `candidate` (e.g. one that
    starts now on a wider tier) or any the running jobs' expected ends make room for.

    Walks the ends in time order, releasing each job on the live state and asking for a
    placement at every distinct time, until nothing that starts later can end earlier:
    a wider tier is tried only while its slowdown still ends before the best found.
    A placement at time t goes around the `reservations` (sorted by start) that it would
    overlap in time, as backfill does now: those starting before t + runtime and not
    ended by t. `tried` collects (start, tier, end) of every placement found. None: the
    job never fits, even when everything has ended. With `start_by` (a protected job's
    promise plus its grace), a placement starting by then wins over any starting later.
    """
    best = candidate
    best_end = candidate.end if candidate is not None else math.inf
    fastest = runtime(best_tier)
    walk = _Walk(state, reservations)
    try:
        for t in walk.times(now):
            if t + fastest >= best_end or (t > start_by and best is not None
                                           and best.start <= start_by):
                break
            walk.hold_until(t, t + fastest)
            cap = max(k for k in range(best_tier, 3) if k == best_tier
                      or t + runtime(k) < best_end)
            got = place_best(job, state, reg, best_tier, cap)
            if got is None:
                continue
            end = t + runtime(got.tier)
            if end > t + fastest and walk.would_overlap(got.allocations, t, end):
                continue      # its slowdown would run it into a reservation not held
            if tried is not None:
                tried.append((t, got.tier, end))
            if end < best_end:
                best, best_end = Reservation(job, t, end, got.allocations, got.tier), end
        return best
    finally:
        walk.undo()


class _Walk:
    """The live state moved forward through the running jobs' expected ends, with the
    holds of the reservations that a placement at the current time would overlap."""

    def __init__(self, state: ClusterState, reservations: list[Reservation]):
        self.state, self.reservations = state, reservations
        self.released: list[tuple[str, list[ReplicaAllocation], float, float]] = []
        self.active: dict[int, Hold] = {}
        self.on_host: dict[int, list[int]] = {}
        self.entered = 0          # reservations[:entered] have been held (some dropped since)
        self.by_end = sorted(range(len(reservations)), key=lambda i: reservations[i].end)
        self.ended = 0            # by_end[:ended] are over

    def times(self, now: float):
        """Each distinct expected end after `now`, with the jobs ending then released, and
        each admin's window's end (its hosts come back then, whatever else runs)."""
        state = self.state
        ends = running_ends(state, now)
        back = sorted({r.end for r in self.reservations if r.frees_hosts and r.end > now})
        k = 0
        while k < len(ends):
            t = ends[k][0]
            while back and back[0] <= t:
                b = back.pop(0)
                if b < t:
                    yield b
            if t == math.inf:
                return
            touched: set[int] = set()
            while k < len(ends) and ends[k][0] == t:
                name = ends[k][1]
                start, end = state.started[name], state.expected_end[name]
                allocs = state.release(name)
                self.released.append((name, allocs, start, end))
                touched.update(a.host.index for a in allocs)
                k += 1
            self._regrab(touched)
            yield t
        if self.reservations:     # after every job: once the last reservation has ended
            last = max(max(r.end for r in self.reservations), ends[-1][0] if ends else now)
            yield from (b for b in back if b < last)
            yield last

    def hold_until(self, t: float, until: float) -> None:
        """Hold the reservations that start before `until` and have not ended by `t`."""
        res = self.reservations
        touched: set[int] = set()
        while self.ended < len(res) and res[self.by_end[self.ended]].end <= t:
            i = self.by_end[self.ended]
            self.ended += 1
            hold = self.active.pop(i, None)
            if hold is not None:
                hold.drop(self.state)
                touched.update(hold.want)
        self._regrab(touched)
        while self.entered < len(res) and res[self.entered].start < until:
            i = self.entered
            self.entered += 1
            if res[i].end <= t:
                continue
            hold = Hold(res[i].allocations)
            hold.grab(self.state)
            self.active[i] = hold
            for host in hold.want:
                self.on_host.setdefault(host, []).append(i)

    def would_overlap(self, allocs: list[ReplicaAllocation], t: float, end: float) -> bool:
        """Whether `allocs` from t to end meet a reservation that is not held."""
        return any(r.start < end and r.end > t and r.overlaps(allocs)
                   for r in self.reservations[self.entered:])

    def _regrab(self, hosts: set[int]) -> None:
        for host in hosts:
            for i in self.on_host.get(host, ()):
                hold = self.active.get(i)
                if hold is not None:
                    hold.grab(self.state, host)

    def undo(self) -> None:
        for hold in self.active.values():
            hold.drop(self.state)
        for name, allocs, start, end in reversed(self.released):
            self.state.commit(name, allocs, start, end)
