"""A host's PCI tree, CPUs and NUMA nodes laid out from a gpu-topology/v1 model, and
written as a fake /sys (and /proc) the agent's discovery reads like the real ones.

The PCI tree is built the way DGX boards are: each locality group of the model is a PCIe
switch (upstream port, one downstream port per member) behind a root port; a group's
`parent` is a switch above it; NICs a model lists as PXB to their GPUs sit behind one more
switch inside the group; a group of NICs only is one multi-port card (functions .0, .1);
a NIC without a group has a root port of its own. Top-level groups on one NUMA node share
a host bridge where the model's matrix says PHB between them, and have a host bridge each
otherwise (NODE)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from airflow_gpu.scheduler_core.engine.topology import Topology, format_cpulist

MiB_KB = 1024


@dataclass
class Segment:
    """A PCI bus: where devices attach (behind a host bridge or a bridge)."""

    path: tuple[str, ...]
    bus: int
    numa: int
    next_dev: int = 0


@dataclass
class Function:
    label: str | None           # GPU<i>, a NIC name, or None for a bridge
    path: tuple[str, ...]       # components below /sys/devices, ending with the bdf
    numa: int

    @property
    def bdf(self) -> str:
        return self.path[-1]


@dataclass
class FakePci:
    topo: Topology
    functions: list[Function] = field(default_factory=list)
    next_bus: int = 0

    def __post_init__(self) -> None:
        self._layout()

    # -- allocation -------------------------------------------------------------------
    def _host_bridge(self, numa: int) -> Segment:
        bus = self._bus()
        return Segment((f"pci0000:{bus:02x}",), bus, numa)

    def _bus(self) -> int:
        bus, self.next_bus = self.next_bus, self.next_bus + 1
        assert bus < 256, "the fake PCI tree ran out of bus numbers"
        return bus

    def _attach(self, seg: Segment, label: str | None, fn: int = 0,
                numa: int | None = None) -> Function:
        if fn == 0:
            seg.next_dev += 1
        bdf = f"0000:{seg.bus:02x}:{seg.next_dev - 1:02x}.{fn}"
        f = Function(label, (*seg.path, bdf), seg.numa if numa is None else numa)
        self.functions.append(f)
        return f

    def _bridge(self, seg: Segment) -> Segment:
        f = self._attach(seg, None)
        return Segment(f.path, self._bus(), seg.numa)

    # -- the layout -------------------------------------------------------------------
    def _layout(self) -> None:
        t = self.topo
        groups = {s.id: s for s in t.pcie_switches}
        numa = {s.id: -1 if s.numa_node is None else s.numa_node for s in t.pcie_switches}
        children: dict[str | None, list[str]] = {}
        for s in t.pcie_switches:
            children.setdefault(s.parent if s.parent in groups else None, []).append(s.id)

        def top(gid: str) -> str:
            while groups[gid].parent in groups:
                gid = groups[gid].parent
            return gid

        # top-level groups the matrix calls PHB apart share one host bridge
        share = {g: g for g in children.get(None, [])}

        def find(g: str) -> str:
            while share[g] != g:
                g = share[g]
            return g

        nic_group = {n.name: n.pcie_switch for n in t.nics}
        if t.topo_matrix:
            cols = t.topo_matrix.columns
            for g in t.gpus:
                for col, cell in zip(cols, t.topo_matrix.rows.get(f"GPU{g.index}", []),
                                     strict=False):
                    if cell == "PHB" and nic_group.get(col) in groups:
                        share[find(top(nic_group[col]))] = find(top(g.pcie_switch))
        bridges: dict[str, Segment] = {}
        for g in children.get(None, []):
            root = find(g)
            if root not in bridges:
                bridges[root] = self._host_bridge(numa[g])
            self._group(g, self._bridge(bridges[root]), children, numa)
        for nic in t.nics:
            if nic.pcie_switch not in groups:       # a NIC on a root port of its own
                hb = self._host_bridge(-1 if nic.numa_node is None else nic.numa_node)
                self._attach(self._bridge(hb), nic.name)

    def _group(self, gid: str, seg: Segment, children, numa) -> None:
        t = self.topo
        seg.numa = numa[gid]
        gpus = [f"GPU{g.index}" for g in sorted(t.gpus, key=lambda g: g.index)
                if g.pcie_switch == gid]
        nics = [n for n in t.nics if n.pcie_switch == gid]
        if not gpus and not children.get(gid):       # a multi-port card
            for fn, nic in enumerate(nics):
                self._attach(seg, nic.name, fn)
            return
        switch = self._bridge(seg)                    # upstream port
        for child in children.get(gid, []):
            self._group(child, self._bridge(switch), children, numa)
        for label in gpus:
            self._attach(self._bridge(switch), label)
        far = [n for n in nics if n.pxb_gpus]
        for nic in (n for n in nics if not n.pxb_gpus):
            self._attach(self._bridge(switch), nic.name)
        if far:
            inner = self._bridge(self._bridge(switch))
            for nic in far:
                self._attach(self._bridge(inner), nic.name)

    # -- lookups ----------------------------------------------------------------------
    def by_label(self, label: str) -> Function:
        return next(f for f in self.functions if f.label == label)

    def common_ancestor(self, a: str, b: str) -> int:
        """NVML's nvmlDeviceGetTopologyCommonAncestor between two labelled devices."""
        fa, fb = self.by_label(a), self.by_label(b)
        if fa.bdf == fb.bdf:
            return 0
        if fa.path[0] != fb.path[0]:
            return 40 if fa.numa >= 0 and fa.numa == fb.numa else 50
        shared = 0
        while fa.path[shared] == fb.path[shared]:
            shared += 1
        if shared == 1:
            return 30
        deepest = max(len(fa.path), len(fb.path)) - 1
        return 10 if deepest - shared <= 1 else 20


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def write_host(topo: Topology, pci: FakePci, root: Path) -> tuple[Path, Path]:
    """Write the fake /sys and /proc under `root`; returns (sysfs, procfs)."""
    sysfs, procfs = root / "sys", root / "proc"
    host = topo.host
    node_cpus = {n.id: n.cpus for n in host.numa_nodes}
    all_cpus = sorted(c for cpus in node_cpus.values() for c in cpus)
    for f in pci.functions:
        d = sysfs / "devices" / Path(*f.path)
        d.mkdir(parents=True, exist_ok=True)
        (d / "numa_node").write_text(f"{f.numa}\n")
        (d / "local_cpulist").write_text(format_cpulist(node_cpus.get(f.numa, all_cpus)) + "\n")
        _link(sysfs / "bus" / "pci" / "devices" / f.bdf, d)
    for nic in topo.nics:
        dev = sysfs / "devices" / Path(*pci.by_label(nic.name).path)
        ib = dev / "infiniband" / nic.name
        port = ib / "ports" / "1"
        port.mkdir(parents=True)
        if nic.port_speed_gbps is not None:
            (port / "rate").write_text(f"{nic.port_speed_gbps:g} Gb/sec (4X)\n")
        ethernet = nic.role == "ethernet" or (nic.netdev or "").startswith("en")
        (port / "link_layer").write_text("Ethernet\n" if ethernet else "InfiniBand\n")
        _link(ib / "device", dev)
        _link(sysfs / "class" / "infiniband" / nic.name, ib)
        if nic.netdev:
            (dev / "net" / nic.netdev).mkdir(parents=True)
    cpu_dir = sysfs / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(format_cpulist(all_cpus) + "\n")
    (cpu_dir / "possible").write_text(format_cpulist(all_cpus) + "\n")
    socket_of = {c: n.socket for n in host.numa_nodes for c in n.cpus}
    core_of = {c: i for i, core in enumerate(host.cores()) for c in core}
    for c in all_cpus:
        d = cpu_dir / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{socket_of[c]}\n")
        (d / "core_id").write_text(f"{core_of[c]}\n")
    for n in host.numa_nodes:
        d = sysfs / "devices" / "system" / "node" / f"node{n.id}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(format_cpulist(n.cpus) + "\n")
        kb = int(n.memory_gb * MiB_KB * MiB_KB)
        (d / "meminfo").write_text(f"Node {n.id} MemTotal:       {kb} kB\n"
                                   f"Node {n.id} MemFree:        {kb // 2} kB\n")
    procfs.mkdir(parents=True)
    (procfs / "cpuinfo").write_text("".join(
        f"processor\t: {c}\nvendor_id\t: fake\nmodel name\t: {host.cpu_model}\n\n"
        for c in all_cpus))
    total_kb = int(host.memory_gb * MiB_KB * MiB_KB)
    (procfs / "meminfo").write_text(f"MemTotal:       {total_kb} kB\n")
    return sysfs, procfs
