"""The `count` baseline: what Airflow pools offer. A job starts when enough GPUs are free
anywhere; they are taken host by host in host order, with no notion of NVLink, NUMA,
switches or gangs on one host, and cores and memory are not tracked."""

from __future__ import annotations

from .placement import Placed
from .state import ClusterState, ReplicaAllocation


def place_by_count(name: str, gpus: int, state: ClusterState) -> Placed | None:
    if state.usable_total < gpus:
        return None
    out: list[ReplicaAllocation] = []
    left = gpus
    for host, hs in zip(state.cluster.hosts, state.hosts, strict=True):
        free = hs.usable_gpus
        if not free:
            continue
        mask = 0
        while free and left:
            low = free & -free
            mask |= low
            free ^= low
            left -= 1
        out.append(ReplicaAllocation(name, "gpus", len(out), host, mask, [], []))
        if not left:
            return Placed(out)
    return None
