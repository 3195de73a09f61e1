"""NVLink groups of a host: the sets of GPUs that all talk to each other over NVLink.

Shown in the cluster view so people see why a 4-GPU job on a DGX-1 lands on one quad:
an NVSwitch host is one group, a DGX-1 hybrid cube-mesh is two fully connected quads
(plus cross links), a PCIe-only host is one group per GPU.
"""

from __future__ import annotations


def nvlink_groups(links: list[list[int]]) -> list[list[int]]:
    """Partition GPU indices into fully NVLink-connected groups, greedily by index.

    `links[a][b]` is the NVLink count between GPUs a and b (0: none). Greedy is enough
    for the DGX models: their cliques are the quads or the whole host."""
    left = list(range(len(links)))
    groups: list[list[int]] = []
    while left:
        group = [left.pop(0)]
        for g in list(left):
            if all(links[g][m] for m in group):
                group.append(g)
                left.remove(g)
        groups.append(group)
    return groups
