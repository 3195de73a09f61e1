"""The `count` baseline: what Airflow pools offer. A job starts when enough GPUs are free
anywhere; they are taken host by host in host order, with no notion of NVLink, NUMA,
switches or gangs on one host, and cores and memory are not tracked. MIG devices are
counted the same way: free devices of the profile asked, anywhere."""

from __future__ import annotations

from .need import Need, mig_eligible
from .placement import Placed
from .state import ClusterState, ReplicaAllocation


def place_by_count(name: str, gpus: int, state: ClusterState,
                   needs: list[Need] = ()) -> Placed | None:
    mig = [n for n in needs if n.mig]
    if mig:
        return _mig_by_count(name, gpus, state, mig)
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


def _mig_by_count(name: str, gpus: int, state: ClusterState, mig: list[Need]) -> Placed | None:
    """Each MIG need's devices, host by host, then the whole GPUs (count policy)."""
    taken: dict[int, int] = {}             # host index -> slots taken so far
    out: list[ReplicaAllocation] = []
    for need in mig:
        left = need.slices * need.replicas
        for host, hs in zip(state.cluster.hosts, state.hosts, strict=True):
            if host.type.mig is None or not left:
                continue
            free = hs.usable_slices & mig_eligible(host.type, need) & ~taken.get(host.index, 0)
            mask = 0
            while free and left:
                low = free & -free
                mask, free, left = mask | low, free ^ low, left - 1
            if mask:
                taken[host.index] = taken.get(host.index, 0) | mask
                out.append(ReplicaAllocation(name, need.role, len(out), host, 0, [], [],
                                             slice_mask=mask))
        if left:
            return None
    if gpus:
        rest = place_by_count(name, gpus, state)
        if rest is None:
            return None
        out += rest.allocations
    return Placed(out)
