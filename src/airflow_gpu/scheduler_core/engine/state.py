"""What is free on each host right now, who holds what, and until when.

Mutated only through `commit` / `release` (and `hold` / `unhold` for reservations).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from .cluster import Cluster, Host, tier_of_hosts
from .hosttype import bits


class HostState:
    """Free GPUs (bitmask), free logical CPUs per NUMA position (bitmasks), free memory per NUMA.

    `bad_gpus` (hard faults) are never handed out; `worn_gpus` (rising error counts,
    thermal throttling) stay usable, but placement prefers the others. GPUs in MIG mode
    are never free whole: their MIG devices are (`free_slices`, bits of the host type's
    `mig` slots; `bad_slices`: those of bad GPUs).
    """

    __slots__ = ("free_gpus", "bad_gpus", "free_cpus", "free_mem", "drained", "worn_gpus",
                 "free_slices", "bad_slices")

    def __init__(self, free_gpus: int, free_cpus: list[int], free_mem: list[int],
                 bad_gpus: int = 0, drained: bool = False, worn_gpus: int = 0,
                 free_slices: int = 0, bad_slices: int = 0):
        self.free_gpus = free_gpus
        self.bad_gpus = bad_gpus
        self.free_cpus = free_cpus
        self.free_mem = free_mem
        self.drained = drained
        self.worn_gpus = worn_gpus
        self.free_slices = free_slices
        self.bad_slices = bad_slices

    @classmethod
    def empty(cls, host: Host) -> HostState:
        t = host.type
        slices = t.mig.all if t.mig is not None else 0
        return cls(t.all_gpus & ~t.mig_gpus, list(t.numa_cpus), list(t.numa_mem),
                   free_slices=slices)

    def copy(self) -> HostState:
        return HostState(self.free_gpus, list(self.free_cpus), list(self.free_mem),
                         self.bad_gpus, self.drained, self.worn_gpus, self.free_slices,
                         self.bad_slices)

    @property
    def usable_gpus(self) -> int:
        return 0 if self.drained else self.free_gpus & ~self.bad_gpus

    @property
    def usable_slices(self) -> int:
        return 0 if self.drained else self.free_slices & ~self.bad_slices

    def n_cpus(self) -> int:
        return sum(m.bit_count() for m in self.free_cpus)


@dataclass
class ReplicaAllocation:
    """One replica's grant: host-local GPU indices, logical CPU ids, NUMA memory, NICs."""

    job: str
    role: str
    index: int
    host: Host
    gpu_mask: int
    cpu_masks: list[tuple[int, int]]     # (NUMA position, CPU bitmask)
    mem: list[tuple[int, int]]           # (NUMA position, bytes)
    nics: list[str] = field(default_factory=list)
    slice_mask: int = 0                  # MIG devices (slots of the host type's `mig`)

    @property
    def slices(self) -> list:
        """The MIG devices granted (mig.Slice), in slot order."""
        mig = self.host.type.mig
        return [s for s in mig.slices if self.slice_mask >> s.slot & 1] if mig else []

    @property
    def gpus(self) -> list[int]:
        return bits(self.gpu_mask)

    @property
    def cpus(self) -> list[int]:
        return sorted(c for _, m in self.cpu_masks for c in bits(m))

    @property
    def numa_nodes(self) -> list[int]:
        ids = self.host.type.numa_ids
        return sorted({ids[p] for p, m in self.cpu_masks if m} | {ids[p] for p, b in self.mem if b})

    @property
    def memory_bytes(self) -> int:
        return sum(b for _, b in self.mem)

    def to_dict(self) -> dict:
        ids = self.host.type.numa_ids
        return {
            "role": self.role, "index": self.index, "host": self.host.name,
            "gpus": self.gpus, "cpus": self.cpus, "numa_nodes": self.numa_nodes,
            "memory_bytes": self.memory_bytes, "nics": list(self.nics),
            "memory_by_numa": {str(ids[p]): b for p, b in self.mem if b},
            **({"mig": [s.to_dict() for s in self.slices]} if self.slice_mask else {}),
        }


def tier_of(allocations: Iterable[ReplicaAllocation]) -> int:
    """The slowdown tier of a placement (cluster.tier_of_hosts)."""
    return tier_of_hosts(a.host for a in allocations)


def take(hs: HostState, a: ReplicaAllocation) -> None:
    hs.free_gpus &= ~a.gpu_mask
    hs.free_slices &= ~a.slice_mask
    for p, m in a.cpu_masks:
        hs.free_cpus[p] &= ~m
    for p, b in a.mem:
        hs.free_mem[p] -= b


def give_back(hs: HostState, a: ReplicaAllocation) -> None:
    hs.free_gpus |= a.gpu_mask
    hs.free_slices |= a.slice_mask
    for p, m in a.cpu_masks:
        hs.free_cpus[p] |= m
    for p, b in a.mem:
        hs.free_mem[p] += b


class ClusterState:
    """The cluster's free resources and live allocations.

    Hosts are also indexed by their number of usable GPUs, so the engine finds
    the tightest host for a job without scanning the whole cluster.
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.hosts = [HostState.empty(h) for h in cluster.hosts]
        self.allocations: dict[str, list[ReplicaAllocation]] = {}
        self.gpus_held: dict[str, int] = {}          # job -> GPUs its allocations hold
        self.started: dict[str, float] = {}          # job -> start time
        self.expected_end: dict[str, float] = {}     # job -> planned end (inf: unknown)
        self._ends: list[tuple[float, str]] = []     # (expected end, job), sorted
        # job -> when it is gone at the latest (its time limit + grace): an overdue job is
        # never re-estimated past it. Kept by the scheduler, not by commit and release.
        self.hard_end: dict[str, float] = {}
        self.usable_total = 0                        # usable GPUs in the whole cluster
        # bumped whenever resources come back earlier than planned (early ends, repairs):
        # reservations planned before may now start sooner
        self.epoch = 0
        self.by_free: list[dict[int, None]] = [{} for _ in range(cluster.max_host_gpus + 1)]
        self._bucket = [0] * len(self.hosts)
        # usable GPUs per switch and per rack, kept current, to rank domains without a scan
        self.switch_free: dict[tuple[str, str], int] = {}
        self.rack_free: dict[str, int] = {}
        self.domain_free: dict[str, int] = {}        # per multi-node NVLink domain
        # host -> {GPU index: why it is worn} (set_degraded_gpus), and whether any GPU is:
        # without worn GPUs the engine skips every wear preference
        self.worn_reasons: dict[str, dict[int, str]] = {}
        self.any_worn = False
        # host -> why it takes no new work (a drained host's reason, "unreachable"): for
        # the pending reasons that name capacity on such hosts
        self.drain_reasons: dict[str, str] = {}
        for h in cluster.hosts:
            self.switch_free.setdefault(h.switch_key, 0)
            self.rack_free.setdefault(h.rack, 0)
            if h.nvlink_domain is not None:
                self.domain_free.setdefault(h.nvlink_domain, 0)
            self.by_free[0][h.index] = None
            self._reindex(h.index)

    def _reindex(self, i: int) -> None:
        hs = self.hosts[i]          # usable_gpus, inline: every hold and release asks
        n = 0 if hs.drained else (hs.free_gpus & ~hs.bad_gpus).bit_count()
        old = self._bucket[i]
        if old == n:
            return
        del self.by_free[old][i]
        self.by_free[n][i] = None
        self._bucket[i] = n
        h, more = self.cluster.hosts[i], n - old
        self.switch_free[h.switch_key] += more
        self.rack_free[h.rack] += more
        if h.nvlink_domain is not None:
            self.domain_free[h.nvlink_domain] += more
        self.usable_total += more

    def commit(self, job: str, allocs: list[ReplicaAllocation], start: float = 0.0,
               expected_end: float = math.inf) -> None:
        if job in self.allocations:
            raise ValueError(f"job {job!r} already holds resources")
        gpus = 0
        for a in allocs:
            self.hold(a)
            gpus += a.gpu_mask.bit_count()
        self.allocations[job] = list(allocs)
        self.gpus_held[job] = gpus
        self.started[job] = start
        self.expected_end[job] = expected_end
        bisect.insort(self._ends, (expected_end, job))

    def release(self, job: str) -> list[ReplicaAllocation]:
        allocs = self.allocations.pop(job, [])
        self.gpus_held.pop(job, None)
        for a in allocs:
            self.unhold(a)
        if job in self.started:
            del self.started[job]
            end = self.expected_end.pop(job)
            del self._ends[bisect.bisect_left(self._ends, (end, job))]
        return allocs

    def set_end(self, job: str, end: float) -> None:
        """A running job's new expected end (it is being stopped)."""
        old = self.expected_end[job]
        del self._ends[bisect.bisect_left(self._ends, (old, job))]
        self.expected_end[job] = end
        bisect.insort(self._ends, (end, job))

    def hold(self, a: ReplicaAllocation) -> None:
        """Take one allocation's resources without recording a job (reservation holds)."""
        i = a.host.index
        take(self.hosts[i], a)
        if a.gpu_mask:           # else usable GPUs unchanged
            self._reindex(i)

    def unhold(self, a: ReplicaAllocation) -> None:
        i = a.host.index
        give_back(self.hosts[i], a)
        if a.gpu_mask:
            self._reindex(i)

    def ends(self) -> list[tuple[float, str]]:
        """Running jobs by expected end, soonest first (a live view: do not mutate)."""
        return self._ends

    def replica_capacity(self, gpus: int) -> int:
        """How many `gpus`-GPU replicas the usable GPUs could hold by counts alone."""
        return sum(len(b) * (n // gpus) for n, b in enumerate(self.by_free) if n >= gpus)

    def set_drained(self, host: str, drained: bool = True) -> None:
        h = self.cluster.by_name[host]
        self.hosts[h.index].drained = drained
        self._reindex(h.index)
        self.epoch += 1

    def set_unhealthy_gpus(self, host: str, gpus: list[int]) -> None:
        h = self.cluster.by_name[host]
        self.hosts[h.index].bad_gpus = sum(1 << g for g in gpus)
        mig = h.type.mig
        self.hosts[h.index].bad_slices = mig.of_gpus(sum(1 << g for g in gpus)) if mig else 0
        self._reindex(h.index)
        self.epoch += 1

    def set_degraded_gpus(self, host: str, gpus: dict[int, str]) -> None:
        """The host's worn GPUs (index -> reason), replacing the ones set before ({}: none).

        Worn GPUs stay schedulable (usable_gpus, the free-GPU index and the epoch are
        unchanged); GPU selection and the built-in health scorer prefer the others.
        Indexes the host does not have are ignored."""
        h = self.cluster.by_name[host]
        mask = sum(1 << g for g in gpus if 0 <= g < h.type.n_gpus)
        self.hosts[h.index].worn_gpus = mask
        if mask:
            self.worn_reasons[host] = {g: why for g, why in sorted(gpus.items())
                                       if mask >> g & 1}
        else:
            self.worn_reasons.pop(host, None)
        self.any_worn = bool(self.worn_reasons)

    def empty_like(self) -> ClusterState:
        """The same hardware with nothing allocated, drained, unhealthy or worn: what could
        ever fit."""
        return ClusterState(self.cluster)
