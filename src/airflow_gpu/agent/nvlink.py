"""NVLink peers and link counts from NVML.

On a direct mesh (DGX-1) the remote end of a link is another GPU, found by its PCI bus
id. On NVSwitch systems (DGX-2, A100, H100, H200) the remote end is a switch: each GPU
counts its switch links, and a pair's strength is min(links_i, links_j), the way
`nvidia-smi topo -m` reports NV# there. Matching remote bus ids against GPUs would report
no links at all on those systems."""

from __future__ import annotations

from dataclasses import dataclass, field

from .nvmlcalls import optional, text
from .pcie import sysfs_bdf

# nvmlDeviceGetNvLinkVersion answers NVML_NVLINK_VERSION_* (1.0, 2.0, 2.2, 3.0, 3.1,
# 4.0, 5.0, 6.0); older drivers answered the generation itself.
_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}


@dataclass
class NvLinks:
    fabric: str                                    # direct | nvswitch | none
    links: list[list[int]]                         # NVLink count between GPU pairs
    links_per_gpu: int = 0
    switches: int | None = None
    generation: int | None = None
    per_gpu: list[int] = field(default_factory=list)   # active links of each GPU


def read_nvlinks(nvml, handles: list, bus_ids: list[str]) -> NvLinks:
    """NVLink peers of each GPU (`bus_ids`: the GPUs' sysfs PCI addresses)."""
    n = len(handles)
    by_bus = {b: i for i, b in enumerate(bus_ids)}
    direct = [[0] * n for _ in range(n)]
    to_switch = [0] * n
    active = [0] * n
    switches: set[str] = set()
    versions: set[int] = set()
    for i, h in enumerate(handles):
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = optional(nvml, nvml.nvmlDeviceGetNvLinkState, h, link)
            if state != nvml.NVML_FEATURE_ENABLED:
                continue          # no such link on this GPU, or the link is down
            active[i] += 1
            version = optional(nvml, nvml.nvmlDeviceGetNvLinkVersion, h, link)
            if version:
                versions.add(version)
            remote = optional(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            bdf = sysfs_bdf(text(remote.busId)) if remote is not None else None
            kind = optional(nvml, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if kind is None:      # drivers before 460: a remote that is no GPU is a switch
                kind = (nvml.NVML_NVLINK_DEVICE_TYPE_GPU if bdf in by_bus
                        else nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
            if kind == nvml.NVML_NVLINK_DEVICE_TYPE_GPU and bdf in by_bus:
                direct[i][by_bus[bdf]] += 1
            elif kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                to_switch[i] += 1
                if bdf:
                    switches.add(bdf)
    # min() of both ends: a link seen from one side only counts for neither
    links = [[0 if i == j else min(direct[i][j], direct[j][i]) + min(to_switch[i], to_switch[j])
              for j in range(n)] for i in range(n)]
    fabric = "nvswitch" if any(to_switch) else "direct" if any(map(any, direct)) else "none"
    return NvLinks(fabric, links, max(active, default=0),
                   len(switches) if fabric == "nvswitch" else None,
                   _GENERATION.get(max(versions)) if versions else None, active)
