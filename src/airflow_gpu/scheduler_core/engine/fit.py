"""Fitting one replica onto one host: GPUs, then cores and memory by NUMA affinity, then NICs."""

from __future__ import annotations

from dataclasses import dataclass, field

from .gpu_selection import ranked_gpu_sets
from .hosttype import Cores, HostType, lowest_bits, round_robin
from .state import HostState, ReplicaAllocation, take


@dataclass(eq=False)
class Need:
    """What each replica of one role needs, compiled for the hot path."""

    role: str
    replicas: int
    gpus: int
    cpus: int
    memory: int
    models: tuple[str, ...] | None      # substrings of the GPU name, any case
    min_gpu_memory: int
    affinity: str                       # strict | preferred | none
    nics: bool
    whole_cores: bool = True            # cores with all their SMT threads, never halves
    mig: str | None = None              # MIG profile asked instead of whole GPUs
    slices: int = 0                     # MIG devices of that profile per replica
    _eligible: dict = field(default_factory=dict)
    _capability: dict = field(default_factory=dict)

    def eligible(self, t: HostType) -> int:
        """Bitmask of the GPUs of this host type that meet the model/memory constraint
        (never GPUs in MIG mode: they are handed out only as MIG devices)."""
        found = self._eligible.get(id(t))
        if found is None:
            found = 0
            models = [m.lower() for m in self.models] if self.models else None
            for i in range(t.n_gpus):
                if t.mig_gpus >> i & 1:
                    continue
                name = t.gpu_name[i].lower()
                if t.gpu_mem[i] >= self.min_gpu_memory and (
                        models is None or any(m in name for m in models)):
                    found |= 1 << i
            self._eligible[id(t)] = found
        return found

    def capability(self, t: HostType) -> tuple[int, int] | None:
        """(GPU memory, NVLink generation) of the best GPU of this host type eligible for
        the need (capability.py ranks hosts by it); None when none is."""
        key = id(t)
        if key not in self._capability:
            mask = self.eligible(t)
            self._capability[key] = (max(t.gpu_mem[i] for i in range(t.n_gpus) if mask >> i & 1),
                                     t.topo.nvlink.generation or 0) if mask else None
        return self._capability[key]

    def upper_bound(self, t: HostType, hs: HostState) -> int:
        """Replicas that could fit on the host by counts alone (exact fit may give fewer)."""
        if self.mig:
            from .migfit import upper_bound

            return upper_bound(t, hs, self)
        n = 1 << 30
        if self.gpus:
            n = (hs.usable_gpus & self.eligible(t)).bit_count() // self.gpus
            if not n:
                return 0
        elif hs.drained:
            return 0
        n = min(n, hs.n_cpus() // self.cpus)
        if self.memory:
            n = min(n, sum(hs.free_mem) // self.memory)
        return n


def free_cpus(avail: int, cores: Cores | None) -> int:
    """How many of the `avail` CPUs can be handed out: with `cores`, only whole cores."""
    return avail.bit_count() if cores is None else cores.free(avail)


def _cpus_from(avail: int, want: int, cores: Cores | None) -> int:
    """`want` CPUs from `avail`, lowest first; with `cores`, whole cores (the last one may
    bring more threads than asked)."""
    return lowest_bits(avail, want) if cores is None else cores.take(avail, want)


def _take_from(pools: list[int], hs: HostState, cpus: int, memory: int,
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


def _pools(t: HostType, hs: HostState, local: list[int], widen: bool) -> list[int]:
    """NUMA positions to draw from: the GPUs' own first, then (if `widen`) the same socket,
    then the rest; remote nodes with the fewest free GPUs first, so their cores stay free."""
    if not widen:
        return local
    sockets = {t.numa_socket[p] for p in local}
    rest = [p for p in range(len(t.numa_ids)) if p not in local]
    rest.sort(key=lambda p: (t.numa_socket[p] not in sockets,
                             (t.numa_gpus[p] & hs.usable_gpus).bit_count(), p))
    return local + rest


def fit_replica(t: HostType, hs: HostState, need: Need) -> tuple | None:
    """(gpu_mask, cpu_take, mem_take) for one replica on this host, best choice first; or None.
    For a need of MIG devices, the first is the mask of MIG slots (migfit.fit_slices)."""
    if need.mig:
        from .migfit import fit_slices

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
                return 0, *_take_from([p], hs, need.cpus, need.memory, cores=cores)
        got = _take_from(order, hs, need.cpus, need.memory, cores=cores)
        return (0, *got) if got else None
    free = hs.usable_gpus & need.eligible(t)
    if free.bit_count() < need.gpus:
        return None
    sets = ranked_gpu_sets(t, free, need.gpus, hs.worn_gpus)
    # strict and preferred first look for a GPU set whose own NUMA nodes hold the cores;
    # preferred then widens, none widens at once.
    passes = {"strict": (False,), "preferred": (False, True), "none": (True,)}[need.affinity]
    for widen in passes:
        for gset in sets if widen else (*sets, *_spread_by_cores(t, hs, free, need)):
            shares = _gpu_numas(t, gset)
            got = _take_from(_pools(t, hs, list(shares), widen), hs, need.cpus, need.memory,
                             shares, cores)
            if got:
                return gset, *got
    return None


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
