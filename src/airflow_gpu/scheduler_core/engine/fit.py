"""Fitting one replica onto one host: GPUs, then cores and memory by NUMA affinity, then NICs."""

from __future__ import annotations

from .cpumem import free_cpus, numa_pools, take_from
from .gpu_selection import ranked_gpu_sets
from .hosttype import HostType, round_robin
from .migfit import fit_slices
from .need import Need
from .state import HostState, ReplicaAllocation, take


def fit_replica(t: HostType, hs: HostState, need: Need) -> tuple | None:
    """(gpu_mask, cpu_take, mem_take) for one replica on this host, best choice first; or None.
    For a need of MIG devices, the first is the mask of MIG slots (migfit.fit_slices)."""
    if need.mig:
        return fit_slices(t, hs, need)
    cores = t.numa_cores if need.whole_cores else None
    if need.gpus == 0:
        if hs.drained:
            return None
        # CPU-only: one NUMA node if any holds it (avoiding nodes next to free GPUs), else spread.
        order = sorted(range(len(t.numa_ids)), key=lambda p: (
            (t.numa_gpus[p] & hs.usable_gpus).bit_count(), hs.free_cpus[p].bit_count(), p))
        for p in order:
            if (free_cpus(hs.free_cpus[p], cores[p] if cores else None) >= need.cpus
                    and hs.free_mem[p] >= need.memory):
                return 0, *take_from([p], hs, need.cpus, need.memory, cores=cores)
        got = take_from(order, hs, need.cpus, need.memory, cores=cores)
        return (0, *got) if got else None
    free = hs.usable_gpus & need.eligible(t)
    if free.bit_count() < need.gpus:
        return None
    sets = ranked_gpu_sets(t, free, need.gpus, hs.worn_gpus)
    # strict and preferred first look for a GPU set whose own NUMA nodes hold the cores;
    # preferred then widens, none widens at once.
    passes = {"strict": (False,), "preferred": (False, True), "none": (True,)}[need.affinity]
    for widen in passes:
        for gset in sets if widen else _then_spread(t, hs, free, need, sets):
            shares = _gpu_numas(t, gset)
            got = take_from(numa_pools(t, hs, list(shares), widen), hs, need.cpus, need.memory,
                             shares, cores)
            if got:
                return gset, *got
    return None


def _then_spread(t: HostType, hs: HostState, free: int, need: Need, sets: list[int]):
    """`sets`, then `_spread_by_cores`'s, made only if none of `sets` fits (most do)."""
    yield from sets
    yield from _spread_by_cores(t, hs, free, need)


def _spread_by_cores(t: HostType, hs: HostState, free: int, need: Need) -> list[int]:
    """GPU sets over the NUMA nodes with the most free cores and memory, 2, 3, ... nodes.

    The ranked sets depend on GPUs alone (so they can be cached); when their nodes lack
    the cores or memory, nodes that still have them are tried before giving up: ranked by
    the scarcer of the two resources (relative to what the replica asks), and by each
    alone (one node may bring the cores, another the memory)."""
    nodes = [p for p in range(len(t.numa_ids)) if t.numa_gpus[p] & free]
    cores = t.numa_cores if need.whole_cores else [None] * len(t.numa_ids)
    cpus = {p: free_cpus(hs.free_cpus[p], cores[p]) / need.cpus for p in nodes}
    mem = {p: hs.free_mem[p] / need.memory if need.memory else 1e9 for p in nodes}
    out: list[int] = []
    for rank in (lambda p: min(cpus[p], mem[p]), cpus.get, mem.get):
        order = sorted(nodes, key=lambda p, rank=rank: (-rank(p), p))
        for k in range(2, min(need.gpus, len(order)) + 1):
            m = round_robin([t.numa_gpus[p] & free for p in order[:k]], need.gpus)
            if m and m not in out:
                out.append(m)
    return out


def _gpu_numas(t: HostType, gset: int) -> dict[int, int]:
    """GPUs per NUMA position for the GPUs in `gset`, the node holding most of them first."""
    counts: dict[int, int] = {}
    m = gset
    while m:
        low = m & -m
        p = t.gpu_numa[low.bit_length() - 1]
        counts[p] = counts.get(p, 0) + 1
        m ^= low
    return {p: counts[p] for p in sorted(counts, key=lambda p: (-counts[p], p))}


def nics_for(t: HostType, gset: int) -> list[str]:
    out: list[str] = []
    m = gset
    while m:
        low = m & -m
        for nic in t.gpu_nics[low.bit_length() - 1]:
            if nic not in out:
                out.append(nic)
        m ^= low
    return out


def allocate_replica(t: HostType, hs: HostState, need: Need, job: str, index: int,
                     host) -> ReplicaAllocation | None:
    """Fit and take one replica on `hs` (a scratch copy during a trial)."""
    got = fit_replica(t, hs, need)
    if got is None:
        return None
    gset, cpu_take, mem_take = got
    if need.mig:
        alloc = ReplicaAllocation(job, need.role, index, host, 0, cpu_take, mem_take,
                                  slice_mask=gset)
    else:
        alloc = ReplicaAllocation(job, need.role, index, host, gset, cpu_take, mem_take,
                                  nics_for(t, gset) if need.nics and gset else [])
    take(hs, alloc)
    return alloc
