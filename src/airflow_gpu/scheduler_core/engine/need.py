"""What each replica of one role needs, compiled once per job for the placement hot path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hosttype import HostType
    from .state import HostState


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
    _ranking: dict = field(default_factory=dict)     # capability.ranking

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
            n = (hs.usable_slices & mig_eligible(t, self)).bit_count() // self.slices
            if not n:
                return 0
            n = min(n, hs.n_cpus() // self.cpus)
            if self.memory:
                n = min(n, sum(hs.free_mem) // self.memory)
            return n
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


def mig_eligible(t: HostType, need: Need) -> int:
    """Slots of the host type's MIG devices of the need's profile (and GPU model)."""
    key = ("mig", id(t))
    found = need._eligible.get(key)
    if found is None:
        found = 0
        if t.mig is not None:
            models = [m.lower() for m in need.models] if need.models else None
            for s in t.mig.slices:
                if s.profile == need.mig and (
                        models is None or any(m in t.gpu_name[s.gpu].lower() for m in models)):
                    found |= 1 << s.slot
        need._eligible[key] = found
    return found
