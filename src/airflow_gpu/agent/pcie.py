"""PCIe locality from sysfs: where a device sits in the PCI tree, and the level between
two devices in the terms of `nvidia-smi topo -m` (PIX, PXB, PHB, NODE, SYS).

sysfs places every PCI function under its bridges:
/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:07:00.0 is a device
behind a root port (00:01.0) and one PCIe switch (upstream port 01:00.0, downstream port
02:08.0). Each `pciDDDD:BB` directory is one host bridge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The values of pynvml's NVML_TOPOLOGY_* levels, so NVML's and sysfs' answers compare.
SAME, PIX, PXB, PHB, NODE, SYS = 0, 10, 20, 30, 40, 50
LEVEL_LABELS = {SAME: "X", PIX: "PIX", PXB: "PXB", PHB: "PHB", NODE: "NODE", SYS: "SYS"}


def sysfs_bdf(bus_id: str | bytes) -> str:
    """A PCI address as sysfs writes it: NVML's `00000000:07:00.0` (8-digit domain, upper
    case hex) -> `0000:07:00.0`."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    parts = text.strip().lower().split(":")
    if len(parts) == 2:                      # bus:dev.fn without a domain
        parts.insert(0, "0")
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {text!r} (expected e.g. 00000000:07:00.0)")
    domain, bus, devfn = parts
    dev, fn = devfn.split(".")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16)}"


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class PciDevice:
    """One PCI function and its ancestors, from the host bridge down."""

    bdf: str
    path: tuple[str, ...]        # ('pci0000:00', '0000:00:01.0', ..., bdf)
    numa_node: int | None

    @property
    def host_bridge(self) -> str:
        return self.path[0]

    @property
    def bridges(self) -> tuple[str, ...]:
        """PCI bridges above the device: the root port, then switch ports in pairs."""
        return self.path[1:-1]

    @property
    def switches(self) -> tuple[str, ...]:
        """Upstream ports of the PCIe switches above the device, top first (below a root
        port, switch ports come in pairs: upstream, downstream)."""
        return self.bridges[1::2]

    @property
    def slot(self) -> str:
        """The device without its function number: the ports of one multi-port card."""
        return self.bdf.rsplit(".", 1)[0]

    def locality_groups(self) -> list[str]:
        """Candidate locality groups, tightest first: the switches above it (nearest
        first), its root port, its slot."""
        root_port = self.bridges[:1]
        return [*reversed(self.switches), *root_port, self.slot]


def pci_device(sysfs: Path, bdf: str) -> PciDevice:
    """The device `bdf` (sysfs form) as the PCI tree under `sysfs` shows it."""
    link = sysfs / "bus" / "pci" / "devices" / bdf
    real = link.resolve()
    if not real.is_dir():
        raise LookupError(f"{link} does not exist: PCI device {bdf} is not in sysfs")
    try:
        parts = real.relative_to((sysfs / "devices").resolve()).parts
    except ValueError:
        raise LookupError(f"{link} points outside {sysfs / 'devices'}") from None
    numa = read_int(real / "numa_node")
    return PciDevice(bdf, tuple(parts), numa if numa is not None and numa >= 0 else None)


def pci_level(a: PciDevice, b: PciDevice) -> int:
    """The `nvidia-smi topo -m` level between two devices (one of the constants above).

    Different host bridges: NODE within one NUMA node, else SYS. Same host bridge with no
    bridge in common: PHB. Otherwise count the bridges between the deepest common one and
    each device: at most one on either side is PIX (one switch), more is PXB."""
    if a.bdf == b.bdf:
        return SAME
    if a.host_bridge != b.host_bridge:
        return NODE if a.numa_node is not None and a.numa_node == b.numa_node else SYS
    up_a, up_b = a.path[:-1], b.path[:-1]
    common = 0
    for x, y in zip(up_a, up_b, strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:
        return PHB
    return PIX if max(len(up_a), len(up_b)) - common <= 1 else PXB
