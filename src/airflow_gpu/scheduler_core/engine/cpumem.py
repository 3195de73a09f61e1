"""Cores and memory for one replica from a host's NUMA nodes (fit.py and migfit.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hosttype import lowest_bits

if TYPE_CHECKING:
    from .hosttype import Cores, HostType
    from .state import HostState


def free_cpus(avail: int, cores: Cores | None) -> int:
    """How many of the `avail` CPUs can be handed out: with `cores`, only whole cores."""
    return avail.bit_count() if cores is None else cores.free(avail)


def _cpus_from(avail: int, want: int, cores: Cores | None) -> int:
    """`want` CPUs from `avail`, lowest first; with `cores`, whole cores (the last one may
    bring more threads than asked)."""
    return lowest_bits(avail, want) if cores is None else cores.take(avail, want)


def take_from(pools: list[int], hs: HostState, cpus: int, memory: int,
               shares: dict[int, int] | None = None,
               cores: list[Cores] | None = None):
    """Cores (lowest ids first) and memory from NUMA positions in `pools` order, or None.

    With `shares` (GPUs per NUMA position), cores and memory are first split in
    proportion, so each GPU's process finds cores and memory on its own node. With
    `cores` (the physical cores per NUMA position) CPUs come as whole cores.
    """
    cpu_got: dict[int, int] = {}
    mem_got: dict[int, int] = {}
    total = sum(shares.values()) if shares else 0
    for want, got, free, is_cpu in ((cpus, cpu_got, hs.free_cpus, True),
                                    (memory, mem_got, hs.free_mem, False)):
        rounds = []
        if total:
            rounds.append({p: -(-want * n // total) for p, n in shares.items()})
        rounds.append(None)
        for cap in rounds:
            for p in pools:
                if want <= 0:
                    break
                pool_cores = cores[p] if cores is not None else None
                avail = free[p] & ~got.get(p, 0) if is_cpu else 0
                have = free_cpus(avail, pool_cores) if is_cpu else free[p] - got.get(p, 0)
                n = min(have, want, cap.get(p, 0) if cap is not None else want)
                if n <= 0:
                    continue
                if is_cpu:
                    taken = _cpus_from(avail, n, pool_cores)
                    got[p] = got.get(p, 0) | taken
                    n = taken.bit_count()
                else:
                    got[p] = got.get(p, 0) + n
                want -= n
        if want > 0:
            return None
    return sorted(cpu_got.items()), sorted(mem_got.items())


def numa_pools(t: HostType, hs: HostState, local: list[int], widen: bool) -> list[int]:
    """NUMA positions to draw from: the GPUs' own first, then (if `widen`) the same socket,
    then the rest; remote nodes with the fewest free GPUs first, so their cores stay free."""
    if not widen:
        return local
    sockets = {t.numa_socket[p] for p in local}
    rest = [p for p in range(len(t.numa_ids)) if p not in local]
    rest.sort(key=lambda p: (t.numa_socket[p] not in sockets,
                             (t.numa_gpus[p] & hs.usable_gpus).bit_count(), p))
    return local + rest
