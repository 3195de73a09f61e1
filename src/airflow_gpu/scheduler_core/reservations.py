"""Reservations: specific hosts, GPUs, cores and memory promised to a blocked job at a time.

A reservation is protected by a `Hold`: the parts of its resources that are free are
taken from the live state (without a job), so `place` goes around them. Holds and the
earliest-start walk change the live state only between a call and its undo; the state
is exactly as before when they return.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .placement import Placed, place
from .state import ClusterState, ReplicaAllocation

if TYPE_CHECKING:
    from .jobqueue import QueuedJob
    from .plugins import Registry


@dataclass(eq=False)
class Reservation:
    job: QueuedJob
    start: float
    end: float
    allocations: list[ReplicaAllocation]

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(a.host.name for a in self.allocations))

    def overlaps(self, allocs: list[ReplicaAllocation]) -> bool:
        """Whether `allocs` take any GPU or core this reservation holds."""
        mine: dict[int, tuple[int, dict[int, int]]] = {}
        for a in self.allocations:
            g, cpus = mine.get(a.host.index, (0, {}))
            for p, m in a.cpu_masks:
                cpus[p] = cpus.get(p, 0) | m
            mine[a.host.index] = (g | a.gpu_mask, cpus)
        for a in allocs:
            if a.host.index not in mine:
                continue
            g, cpus = mine[a.host.index]
            if a.gpu_mask & g or any(m & cpus.get(p, 0) for p, m in a.cpu_masks):
                return True
        return False


class Hold:
    """Takes a reservation's resources from the state as they come free; `drop` returns them."""

    def __init__(self, allocations: list[ReplicaAllocation]):
        # what is still to take, per replica: [alloc, gpu mask, {numa: cpu mask}, {numa: bytes}]
        self.want = [[a, a.gpu_mask, dict(a.cpu_masks), dict(a.mem)] for a in allocations]
        self.pieces: list[ReplicaAllocation] = []

    def grab(self, state: ClusterState, hosts: set[int] | None = None) -> None:
        for w in self.want:
            a, gpus, cpus, mem = w
            if hosts is not None and a.host.index not in hosts:
                continue
            hs = state.hosts[a.host.index]
            g = gpus & hs.free_gpus
            c = [(p, m & hs.free_cpus[p]) for p, m in cpus.items() if m & hs.free_cpus[p]]
            b = [(p, min(n, hs.free_mem[p])) for p, n in mem.items() if n and hs.free_mem[p] > 0]
            if not (g or c or b):
                continue
            piece = ReplicaAllocation(a.job, a.role, a.index, a.host, g, c, b)
            state.hold(piece)
            self.pieces.append(piece)
            w[1] = gpus & ~g
            for p, m in c:
                cpus[p] &= ~m
            for p, n in b:
                mem[p] -= n

    def drop(self, state: ClusterState) -> None:
        for piece in reversed(self.pieces):
            state.unhold(piece)
        self.pieces.clear()


def hold_all(state: ClusterState, reservations: list[Reservation]) -> list[Hold]:
    holds = [Hold(r.allocations) for r in reservations]
    for h in holds:
        h.grab(state)
    return holds


def drop_all(state: ClusterState, holds: list[Hold]) -> None:
    for h in reversed(holds):
        h.drop(state)


def could_fit(job: QueuedJob, state: ClusterState) -> bool:
    """A cheap necessary condition (GPU counts only) before trying `place`."""
    if state.usable_total < job.gpus:
        return False
    return all(state.replica_capacity(n.gpus) >= n.replicas for n in job.needs if n.gpus)


def earliest_start(job: QueuedJob, state: ClusterState, reg: Registry, now: float,
                   reservations: list[Reservation]) -> Reservation | None:
    """The first time after now that the running jobs' expected ends leave room for `job`
    (the caller found none now), and where.

    Walks the ends in time order, releasing each job on the live state and asking
    `place` at every distinct time. `reservations` are held for the whole walk until
    they end (so the new one goes around them). A running job past its expected end is
    assumed to end now. None: the job never fits even when everything has ended.
    """
    holds = hold_all(state, reservations)
    active = dict(enumerate(holds))
    released: list[tuple[str, list[ReplicaAllocation], float, float]] = []
    events = heapq.merge(
        ((max(end, now), 0, name) for end, name in list(state.ends())),
        sorted((r.end, 1, i) for i, r in enumerate(reservations)))
    found = None
    try:
        pending = next(events, None)
        while pending is not None:
            t, kind, key = pending
            if kind == 0:
                start, end = state.started[key], state.expected_end[key]
                allocs = state.release(key)
                released.append((key, allocs, start, end))
                touched = {a.host.index for a in allocs}
            else:
                active.pop(key).drop(state)
                touched = {a.host.index for a in reservations[key].allocations}
            for h in active.values():
                h.grab(state, touched)
            pending = next(events, None)
            if pending is not None and pending[0] == t:
                continue
            if t == math.inf:
                break
            if could_fit(job, state):
                got = place(job.spec, state, reg, job.needs)
                if isinstance(got, Placed):
                    found = Reservation(job, t, t + job.runtime, got.allocations)
                    break
        return found
    finally:
        drop_all(state, list(active.values()))
        for name, allocs, start, end in reversed(released):
            state.commit(name, allocs, start, end)
