"""Which GPUs of one host a replica gets: NVLink first, then PCIe/NUMA locality, then tight fit.

- Direct NVLink (DGX-1): every subset of the free GPUs is scored by how many of
  its pairs are NVLink-connected and by their link counts, so a 4-GPU replica
  gets a fully connected quad and a 2-GPU replica an NV2 pair; ties go to the
  quad (NUMA node) with the fewest free GPUs left, so whole quads stay free.
- NVSwitch (all pairs equal): candidates come from the locality tree (PCIe
  switch < PCIe parent < NUMA node < socket < host); the tightest subtree wins,
  and among equals the one with the fewest free GPUs left (best fit), so
  untouched switches and NUMA nodes stay whole for later jobs.
- Worn GPUs (rising error counts, thermal throttling: `HostState.worn_gpus`) are used
  last: on NVLink hosts, among the sets with the best NVLink score the one with the
  fewest worn GPUs wins; on NVSwitch hosts the sets of GPUs that are not worn come
  first (ranked as if the worn ones were taken), then the sets that need worn GPUs.
  Without worn GPUs the ranking is unchanged.
"""

from __future__ import annotations

from itertools import combinations

from .hosttype import HostType, TreeNode, bits

_MAX_ENUMERATED_SUBSETS = 5000


def _fill(node: TreeNode, free: int, count: int) -> int:
    """Pick `count` free GPUs under `node`, touching as few and as full subtrees as possible."""
    if not node.children:
        return node.mask
    kids = [(c, (c.mask & free).bit_count()) for c in node.children]
    kids = [(c, n) for c, n in kids if n]
    chosen = 0
    while count > 0:
        fitting = [(n, i) for i, (c, n) in enumerate(kids) if n >= count]
        if fitting:
            _, i = min(fitting)  # best fit: the fullest subtree that still holds the rest
            return chosen | _fill(kids[i][0], free, count)
        i = max(range(len(kids)), key=lambda k: (kids[k][1], -k))
        child, n = kids.pop(i)
        chosen |= _fill(child, free, n)
        count -= n
    return chosen


def _span(htype: HostType, subset: int, free: int) -> tuple[int, int]:
    """(level of the tightest subtree holding `subset`, free GPUs left in that subtree)."""
    node = htype.tree
    while True:
        inner = next((c for c in node.children if c.children and subset & ~c.mask == 0), None)
        if inner is None:
            return node.level, (node.mask & free & ~subset).bit_count()
        node = inner


def _nvlink_score(htype: HostType, gpus: list[int]) -> tuple[int, int]:
    pairs = links = 0
    for a, b in combinations(gpus, 2):
        n = htype.links[a][b]
        if n:
            pairs += 1
            links += n
    return pairs, links


def _candidates(htype: HostType, free: int, count: int) -> set[int]:
    free_list = bits(free)
    found: set[int] = set()
    stack = [htype.tree]
    while stack:
        node = stack.pop()
        if (node.mask & free).bit_count() >= count and node.children:
            found.add(_fill(node, free, count))
            stack.extend(node.children)
    if htype.fabric == "direct":
        n_subsets = 1
        for i in range(count):
            n_subsets = n_subsets * (len(free_list) - i) // (i + 1)
        if n_subsets <= _MAX_ENUMERATED_SUBSETS:
            found.update(sum(1 << g for g in c) for c in combinations(free_list, count))
    return found


def rank_gpu_sets(htype: HostType, free: int, count: int, worn: int = 0) -> tuple[int, ...]:
    """All candidate GPU sets of size `count` within `free`, best first, as bitmasks;
    GPUs in `worn` are taken last (see the module docstring)."""
    if count <= 0 or free.bit_count() < count:
        return ()
    worn &= free
    clean = free & ~worn
    if worn and htype.fabric != "direct":
        first = rank_gpu_sets(htype, clean, count)
        return first + tuple(s for s in rank_gpu_sets(htype, free, count) if s & worn)

    def key(subset: int):
        gpus = bits(subset)
        level, left = _span(htype, subset, free)
        numas = {htype.gpu_numa[g] for g in gpus}
        if htype.fabric != "direct":
            return (level, len(numas), left, gpus)
        # NVLink decides; then keep whole NVLink groups (a DGX-1 quad is one NUMA node)
        # free by taking from the NUMA node with the fewest free GPUs left.
        pairs, links = _nvlink_score(htype, gpus)
        numa_left = sum((htype.numa_gpus[n] & free & ~subset).bit_count() for n in numas)
        return (-pairs, -links, (subset & worn).bit_count(), len(numas), numa_left, level,
                gpus)

    found = _candidates(htype, free, count)
    if worn and clean.bit_count() >= count:
        found |= _candidates(htype, clean, count)
    return tuple(sorted(found, key=key))


def ranked_gpu_sets(htype: HostType, free: int, count: int, worn: int = 0) -> tuple[int, ...]:
    """rank_gpu_sets, kept on the host type: every host of one model shares the answers."""
    worn &= free
    key = (free, count, worn) if worn else (free, count)
    found = htype._ranked.get(key)
    if found is None:
        if len(htype._ranked) > 200_000:
            htype._ranked.clear()
        found = htype._ranked[key] = rank_gpu_sets(htype, free, count, worn)
    return found
