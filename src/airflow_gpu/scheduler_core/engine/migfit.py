"""Fitting a replica that asks MIG devices (`gpu.mig`) onto one host, and what the
pending and never-fits reasons say of MIG.

Each MIG device is an exclusive unit. A replica's devices come from GPUs on one NUMA
node and its cores and memory from that node (as whole GPUs do, by placement.affinity);
among the GPUs, those already partly used come first and the fewest free devices first,
so untouched MIG GPUs stay whole for jobs asking large profiles.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from .cpumem import numa_pools, take_from
from .hosttype import HostType
from .mig import ALL_PROFILES, FAMILIES, family_of, slice_labels, unknown_profile
from .need import Need, mig_eligible

if TYPE_CHECKING:
    from .cluster import Cluster, Host
    from .state import ClusterState, HostState

# holders a pending reason's details name (`held_by`, `mig_held_by`), largest first; the
# rest are counted (`held_by_more`): a reason stays small however many jobs hold GPUs
HOLDERS_KEPT = 20


def _gpu_order(t: HostType, hs: HostState, cand: int) -> list[int]:
    """GPUs holding candidate devices: partly used first, then fewest free devices."""
    mig = t.mig
    gpus = [g for g, m in mig.by_gpu.items() if m & cand]
    return sorted(gpus, key=lambda g: (hs.free_slices & mig.by_gpu[g] == mig.by_gpu[g],
                                       (hs.free_slices & mig.by_gpu[g]).bit_count(), g))


def _pick(t: HostType, gpus: list[int], cand: int, count: int) -> int:
    """`count` devices from `gpus` in order, lowest slots of a GPU first (0 if too few)."""
    picked = 0
    for g in gpus:
        m = cand & t.mig.by_gpu[g]
        while m and count:
            low = m & -m
            picked |= low
            m ^= low
            count -= 1
        if not count:
            return picked
    return 0


def fit_slices(t: HostType, hs: HostState, need: Need) -> tuple | None:
    """(slot mask, cpu_take, mem_take) for one replica on this host, or None."""
    if t.mig is None:
        return None
    cand = hs.usable_slices & mig_eligible(t, need)
    if cand.bit_count() < need.slices:
        return None
    cores = t.numa_cores if need.whole_cores else None
    order = _gpu_order(t, hs, cand)
    nodes = list(dict.fromkeys(t.gpu_numa[g] for g in order))
    choices: list[tuple[int, dict[int, int]]] = []
    for p in nodes:            # devices of one NUMA node, the best node first
        picked = _pick(t, [g for g in order if t.gpu_numa[g] == p], cand, need.slices)
        if picked:
            choices.append((picked, {p: need.slices}))
    if not choices:            # more devices than one node has: over several nodes
        picked = _pick(t, order, cand, need.slices)
        shares: dict[int, int] = {}
        for s in t.mig.slices:
            if picked >> s.slot & 1:
                shares[s.numa] = shares.get(s.numa, 0) + 1
        choices.append((picked, dict(sorted(shares.items(), key=lambda kv: -kv[1]))))
    passes = {"strict": (False,), "preferred": (False, True), "none": (True,)}[need.affinity]
    for widen in passes:
        for picked, shares in choices:
            got = take_from(numa_pools(t, hs, list(shares), widen), hs, need.cpus, need.memory,
                             shares if len(shares) > 1 else None, cores)
            if got:
                return picked, *got
    return None


_MIG_HOSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mig_hosts(cluster: Cluster) -> list[Host]:
    found = _MIG_HOSTS.get(cluster)
    if found is None:
        found = _MIG_HOSTS[cluster] = [h for h in cluster.hosts if h.type.mig is not None]
    return found


def host_order(state: ClusterState, need: Need) -> list[Host]:
    """Hosts with room for one replica of a MIG need, the fullest first: hosts whose MIG
    GPUs are partly used before untouched ones, then fewest free devices of the profile."""
    out = []
    for h in mig_hosts(state.cluster):
        hs = state.hosts[h.index]
        cand = hs.usable_slices & mig_eligible(h.type, need)
        if cand.bit_count() < need.slices:
            continue
        mig = h.type.mig
        partly = any(hs.free_slices & m != m for g, m in mig.by_gpu.items() if m & cand)
        out.append(((not partly, cand.bit_count(), hs.usable_gpus.bit_count(), h.index), h))
    return [h for _, h in sorted(out, key=lambda x: x[0])]


# -- reasons ------------------------------------------------------------------------------
def describe(need: Need) -> str:
    return f"{need.slices} MIG {need.mig}"


def free_devices(state: ClusterState, need: Need) -> int:
    return sum((state.hosts[h.index].usable_slices & mig_eligible(h.type, need)).bit_count()
               for h in mig_hosts(state.cluster))


def pending_note(state: ClusterState, need: Need) -> tuple[str, dict]:
    """What the pending reason adds for a MIG need: free devices, where, who holds them."""
    free = free_devices(state, need)
    details: dict = {"mig_profile": need.mig, "needs_mig_devices": need.slices * need.replicas,
                     "cluster_free_mig_devices": free}
    best, best_n = None, 0
    for h in mig_hosts(state.cluster):
        n = (state.hosts[h.index].usable_slices & mig_eligible(h.type, need)).bit_count()
        if n > best_n:
            best, best_n = h, n
    text = f"the cluster has {free} free MIG {need.mig} devices"
    if best is not None:
        text += f" (most on {best.name}: {best_n})"
    held: dict[str, list[str]] = {}
    for job, allocs in state.allocations.items():
        for a in allocs:
            mask = a.slice_mask & mig_eligible(a.host.type, need)
            if mask:
                held.setdefault(job, []).extend(
                    f"{a.host.name} {x}" for x in slice_labels(a.host.type.mig, mask))
    if held:
        top = sorted(held.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        details["mig_held_by"] = {j: v for j, v in top[:HOLDERS_KEPT]}
        if len(top) > HOLDERS_KEPT:
            details["mig_held_by_more"] = len(top) - HOLDERS_KEPT
        text += "; held by " + ", ".join(f"{j} ({', '.join(v[:3])}"
                                         f"{' ...' if len(v) > 3 else ''})" for j, v in top[:3])
        text += f" and {len(top) - 3} more jobs" if len(top) > 3 else ""
    return text, details


def never_reason(cluster: Cluster, need: Need) -> str | None:
    """Why a MIG need can never be met by the cluster's MIG devices, or None."""
    offered: dict[str, int] = {}
    for h in mig_hosts(cluster):
        for s in h.type.mig.slices:
            offered[s.profile] = offered.get(s.profile, 0) + 1
    families = {family_of(h.type.gpu_name[i], h.type.gpu_mem[i])
                for h in cluster.hosts for i in range(h.type.n_gpus)} - {None}
    exist = [n for n in ALL_PROFILES if any(n in FAMILIES[f] for f in families)]
    field = f"role '{need.role}': gpu.mig"
    if need.mig not in exist:
        models = ", ".join(sorted(families)) or "none with MIG"
        of = f" of the cluster's GPUs ({models})"
        return f"{field}: {unknown_profile(need.mig, exist or ALL_PROFILES, of)}; ask one of those"
    have = sorted(offered, key=lambda n: (n[0], len(n), n))
    if need.mig not in offered:
        return (f"{field}: profile {need.mig!r} exists for the cluster's GPUs but no GPU is "
                "partitioned with it (MIG devices in the cluster: "
                f"{', '.join(have) or 'none, no GPU is in MIG mode'}); ask one of those, or "
                "have an admin add it to a host's mig layout in the cluster file")
    most = max((mig_eligible(h.type, need).bit_count() for h in mig_hosts(cluster)),
               default=0)
    if most < need.slices:
        return (f"{field}: asks {need.slices} MIG {need.mig} devices per replica but the "
                f"largest host has {most}; use more replicas with fewer devices each")
    total = sum(mig_eligible(h.type, need).bit_count() for h in mig_hosts(cluster))
    if total < need.slices * need.replicas:
        return (f"role '{need.role}': {need.replicas} replicas x {need.slices} MIG {need.mig} "
                f"= {need.slices * need.replicas} devices, but the cluster has {total}; use "
                "fewer replicas, or ask an admin for more GPUs with that profile")
    return None
