"""RDMA NICs (InfiniBand or RoCE HCAs, `mlx5_*`) from /sys/class/infiniband: name, PCI
device, NUMA node, link speed, link layer and network interface."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .pcie import PciDevice, pci_device


@dataclass(frozen=True)
class RdmaNic:
    name: str
    pci: PciDevice
    link_layer: str | None          # "InfiniBand" or "Ethernet" (RoCE), from port 1
    speed_gbps: float | None
    netdev: str | None


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_nics(sysfs: Path = Path("/sys")) -> list[RdmaNic]:
    """Every RDMA device of the host, in natural name order (mlx5_2 before mlx5_10)."""
    root = sysfs / "class" / "infiniband"
    if not root.is_dir():
        return []
    nics = []
    for entry in sorted(root.iterdir(), key=lambda p: _natural(p.name)):
        device = (entry / "device").resolve()
        if not device.is_dir():
            continue                # a software device (rxe) has no PCI function
        port = entry / "ports" / "1"
        rate = _read(port / "rate") or ""          # e.g. "400 Gb/sec (4X NDR)"
        m = re.match(r"([\d.]+) Gb/sec", rate)
        nets = sorted(p.name for p in (device / "net").glob("*")) if (
            device / "net").is_dir() else []
        nics.append(RdmaNic(entry.name, pci_device(sysfs, device.name),
                            _read(port / "link_layer"), float(m.group(1)) if m else None,
                            nets[0] if nets else None))
    return nics
