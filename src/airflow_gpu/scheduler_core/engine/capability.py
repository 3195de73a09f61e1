"""Which GPUs to keep free: the least capable GPUs that fit go first.

A job that names neither a GPU model nor its hosts takes, among the GPUs that meet its
constraints, those with the least memory, then the oldest NVLink generation (V100 <
A100 < H100 < H200 < B200), so the GPUs only some jobs can use stay free for them: a
job asking >= 48 GiB takes H100s and leaves the H200s to a later job asking >= 100 GiB.
A job that names a model or a host has chosen: only tight fit orders its hosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from .hosttype import HostType

if TYPE_CHECKING:
    from .cluster import Cluster
    from .need import Need

# per cluster: its distinct host types, and those of each switch and rack (clusters are
# rebuilt, never changed, when hosts come and go)
_TYPES: WeakKeyDictionary = WeakKeyDictionary()


def _types(cluster: Cluster) -> dict:
    found = _TYPES.get(cluster)
    if found is None:
        def distinct(hosts) -> list[HostType]:
            return list({id(h.type): h.type for h in hosts}.values())

        found = {None: distinct(cluster.hosts)}
        for key, hosts in cluster.switches.items():
            found[("switch", key)] = distinct(hosts)
        for key, hosts in cluster.racks.items():
            found[("rack", key)] = distinct(hosts)
        _TYPES[cluster] = found
    return found


def host_types(cluster: Cluster) -> list[HostType]:
    """The cluster's distinct host types."""
    return _types(cluster)[None]


def ranking(cluster: Cluster, needs: list[Need], chosen: bool) -> Ranking:
    """Ranking(cluster, needs, chosen), kept on the first need: a job's needs are
    compiled once and placed again and again on the same cluster."""
    if not needs:
        return Ranking(cluster, needs, chosen)
    kept = needs[0]._ranking.get(chosen)
    if kept is None or kept.cluster is not cluster or kept.needs is not needs:
        kept = needs[0]._ranking[chosen] = Ranking(cluster, needs, chosen)
    return kept


class Ranking:
    """Capability levels of the host types, for one job's GPU needs. Inactive (every level
    ()) when the job names a model or hosts, or when its GPUs are all of one kind."""

    def __init__(self, cluster: Cluster, needs: list[Need], chosen: bool):
        self.cluster, self.needs = cluster, needs
        gpu_needs = [n for n in needs if n.gpus]
        self._of: dict[int, tuple[int, int]] = {}
        if gpu_needs and not chosen:
            for t in _types(cluster)[None]:      # (Need.capability: higher is more capable)
                caps = [c for n in gpu_needs if (c := n.capability(t)) is not None]
                if caps:
                    self._of[id(t)] = max(caps)
        self.levels: list[tuple] = sorted(set(self._of.values()))
        self.active = len(self.levels) > 1
        if not self.active:
            self.levels = [()]

    def level(self, t: HostType) -> tuple:
        """The host type's level (() when inactive or it has no eligible GPU)."""
        return self._of.get(id(t), ()) if self.active else ()

    def of_placement(self, allocations) -> tuple:
        """A placement's level: that of its most capable GPU host."""
        if not self.active:
            return ()
        return max((self.level(a.host.type) for a in allocations if a.gpu_mask), default=())

    def of_domain(self, kind: str, key) -> tuple:
        """The least capable level a switch or rack offers (to try those domains first)."""
        if not self.active:
            return ()
        found = [self._of[id(t)] for t in _types(self.cluster).get((kind, key), ())
                 if id(t) in self._of]
        return min(found, default=(float("inf"),))
