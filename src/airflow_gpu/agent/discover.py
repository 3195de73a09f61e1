"""Discovery: NVML and sysfs -> the host's `gpu-topology/v1` model, the same document the
built-in DGX files are, so the engine cannot tell a discovered host from a declared one.

What comes from where:
- GPUs (index, name, UUID, memory, PCI bus id, MIG mode and MIG devices: mig.py), CPU
  affinity and NUMA node:
  NVML; sysfs (`local_cpulist`, `numa_node`) where NVML does not say.
- NVLink peers: NVML, per link (nvlink.py).
- PCIe levels: NVML's common ancestor between GPUs, the sysfs PCI tree between GPUs and
  NICs (NVML does not know NICs); locality groups (`pcie_switches`) from the same tree.
- CPUs, NUMA nodes, memory: sysfs and /proc (hostinfo.py); RDMA NICs: /sys/class/infiniband.
"""

from __future__ import annotations

import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from ..scheduler_core.engine.topology import (
    Topology,
    builtin_model_names,
    format_cpulist,
    load_topology,
    parse_cpulist,
)
from ..scheduler_core.errors import InputError
from .hostinfo import read_host
from .mig import read_mig
from .nics import RdmaNic, read_nics
from .nvlink import read_nvlinks
from .nvmlcalls import mask_bits, optional, text
from .pcie import LEVEL_LABELS, PIX, PXB, PciDevice, pci_device, pci_level, sysfs_bdf

MiB = 2**20


@dataclass
class _Gpu:
    index: int
    handle: object
    pci: PciDevice
    doc: dict


def _words(highest: int) -> int:
    """Length of an NVML affinity array (64-bit words) that covers ids 0..highest."""
    return max(1, math.ceil((highest + 1) / 64))


def _affinity(nvml, h, pci: PciDevice, sysfs: Path, nodes: dict[int, list[int]]):
    """(NUMA node, CPU ids) of a GPU: NVML first, then sysfs, then the node of its CPUs."""
    all_cpus = {c for cpus in nodes.values() for c in cpus}
    scope = nvml.NVML_AFFINITY_SCOPE_NODE
    words = optional(nvml, nvml.nvmlDeviceGetCpuAffinityWithinScope, h,
                     _words(max(all_cpus)), scope)
    if words is None:
        words = optional(nvml, nvml.nvmlDeviceGetCpuAffinity, h, _words(max(all_cpus)))
    cpus = [c for c in mask_bits(words) if c in all_cpus] if words is not None else []
    if not cpus:
        try:
            local = (sysfs / "bus" / "pci" / "devices" / pci.bdf / "local_cpulist").read_text()
            cpus = [c for c in parse_cpulist(local.strip()) if c in all_cpus]
        except (OSError, ValueError):
            cpus = []
    # nvmlDeviceGetNumaNodeId is not supported on x86 DGX; memory affinity and sysfs are
    mem = optional(nvml, nvml.nvmlDeviceGetMemoryAffinity, h, _words(max(nodes)), scope)
    found = [n for n in mask_bits(mem) if n in nodes] if mem is not None else []
    if found:
        numa = found[0]
    elif pci.numa_node in nodes:
        numa = pci.numa_node
    else:
        numa = next((n for n, c in nodes.items() if cpus and set(cpus) <= set(c)),
                    next(iter(nodes)))
    return numa, cpus or nodes[numa]


def _read_gpu(nvml, i: int, sysfs: Path, nodes: dict[int, list[int]]) -> _Gpu:
    h = nvml.nvmlDeviceGetHandleByIndex(i)
    bus_id = text(nvml.nvmlDeviceGetPciInfo(h).busId)
    bdf = sysfs_bdf(bus_id)
    try:
        pci = pci_device(sysfs, bdf)
    except LookupError as exc:
        raise InputError(f"GPU {i} ({bus_id}): {exc}; run the agent on the host itself or "
                         "mount the host's /sys into its container") from None
    numa, cpus = _affinity(nvml, h, pci, sysfs, nodes)
    mig = optional(nvml, nvml.nvmlDeviceGetMigMode, h)
    total = nvml.nvmlDeviceGetMemoryInfo(h).total
    doc = {"index": i, "name": text(nvml.nvmlDeviceGetName(h)),
           "memory_mb": total // MiB,
           "numa_node": numa, "cpu_affinity": format_cpulist(cpus),
           "uuid": text(nvml.nvmlDeviceGetUUID(h)), "pci_bus_id": bus_id,
           "mig_mode": bool(mig and mig[0] == nvml.NVML_DEVICE_MIG_ENABLE)}
    if doc["mig_mode"]:
        doc["mig_instances"] = read_mig(nvml, h, doc["name"], total)
    return _Gpu(i, h, pci, doc)


def _gpu_level(nvml, a: _Gpu, b: _Gpu) -> int:
    level = optional(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, a.handle, b.handle)
    return pci_level(a.pci, b.pci) if level is None else int(level)


def _groups(gpus: list[_Gpu], nics: list[RdmaNic]):
    """Locality groups (the `pcie_switches` of the model): a GPU's is the nearest switch
    above it; a NIC's is the nearest group above it that holds a GPU, else its own nearest
    switch, root port or card. Returns (group per GPU, group per NIC, parent per group)."""
    parent: dict[str, str | None] = {}

    def chain(dev: PciDevice, group: str) -> None:
        up = list(dev.switches)
        if group in up:
            k = up.index(group)
            for child, above in zip(up[1:k + 1], up[:k], strict=True):
                parent.setdefault(child, above)
            parent.setdefault(up[0], None)
        else:
            parent.setdefault(group, None)

    gpu_group = [g.pci.locality_groups()[0] for g in gpus]
    held = set(gpu_group)
    nic_group = [next((c for c in n.pci.locality_groups() if c in held),
                      n.pci.locality_groups()[0]) for n in nics]
    for g, group in zip(gpus, gpu_group, strict=True):
        chain(g.pci, group)
    for n, group in zip(nics, nic_group, strict=True):
        chain(n.pci, group)
    return gpu_group, nic_group, parent


def _model_name(gpus: list[dict]) -> str:
    """The built-in model with the same GPUs (count and name), else a name from them."""
    for name in builtin_model_names():
        t = load_topology(name)
        if gpus and len(t.gpus) == len(gpus) and t.gpus[0].name == gpus[0]["name"]:
            return name
    what = gpus[0]["name"] if gpus else "no-gpu"
    return f"{len(gpus)}x-" + re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")


def discover(nvml, sysfs: Path = Path("/sys"), procfs: Path = Path("/proc"),
             hostname: str | None = None) -> Topology:
    """The host's model. NVML must be initialised (nvmlInit) by the caller."""
    host = read_host(sysfs, procfs)
    nodes = {n["id"]: parse_cpulist(n["cpus"]) for n in host["numa_nodes"]}
    gpus = [_read_gpu(nvml, i, sysfs, nodes) for i in range(nvml.nvmlDeviceGetCount())]
    nics = read_nics(sysfs)
    nv = read_nvlinks(nvml, [g.handle for g in gpus], [g.pci.bdf for g in gpus])
    gpu_group, nic_group, parent = _groups(gpus, nics)

    n = len(gpus)
    gpu_nic = [[pci_level(g.pci, nic.pci) for nic in nics] for g in gpus]
    labels = [f"GPU{i}" for i in range(n)] + [nic.name for nic in nics]
    rows: dict[str, list[str]] = {}
    for i, g in enumerate(gpus):
        row = ["X" if i == j else f"NV{nv.links[i][j]}" if nv.links[i][j]
               else LEVEL_LABELS[_gpu_level(nvml, g, gpus[j])] for j in range(n)]
        rows[f"GPU{i}"] = row + [LEVEL_LABELS[x] for x in gpu_nic[i]]
    for k, nic in enumerate(nics):
        rows[nic.name] = ([LEVEL_LABELS[gpu_nic[i][k]] for i in range(n)]
                          + [LEVEL_LABELS[pci_level(nic.pci, other.pci)] for other in nics])

    members: dict[str, list[str]] = {}
    numa_of: dict[str, int | None] = {}
    for g, group in zip(gpus, gpu_group, strict=True):
        g.doc["pcie_switch"] = group
        g.doc["nvlink_peers"] = {j: c for j, c in enumerate(nv.links[g.index]) if c}
        members.setdefault(group, []).append(f"GPU{g.index}")
        numa_of.setdefault(group, g.doc["numa_node"])
    nic_docs = []
    held = set(gpu_group)
    any_local = any(group in held for group in nic_group)
    for k, (nic, group) in enumerate(zip(nics, nic_group, strict=True)):
        local = group in held
        role = ("compute" if local or (not any_local and nic.link_layer == "InfiniBand")
                else "storage" if nic.link_layer == "InfiniBand" else "ethernet")
        mates = [i for i in range(n) if gpu_group[i] == group]
        bus = nic.pci.bdf.split(":")[1]
        nic_docs.append({
            "name": nic.name, "role": role, "port_speed_gbps": nic.speed_gbps,
            "numa_node": nic.pci.numa_node, "pcie_switch": group,
            "pix_gpus": [i for i in mates if gpu_nic[i][k] == PIX],
            "pxb_gpus": [i for i in mates if gpu_nic[i][k] == PXB],
            "netdev": nic.netdev, "pci_bus": f"0x{bus}"})
        members.setdefault(group, []).append(nic.name)
        numa_of.setdefault(group, nic.pci.numa_node)
    for group, above in list(parent.items()):      # parents get the NUMA node of a child
        if above is not None and above not in numa_of:
            numa_of[above] = numa_of.get(group)
    switches = [{"id": s, "numa_node": numa_of.get(s), "parent": parent.get(s),
                 "members": members.get(s, [])} for s in dict.fromkeys([*members, *parent])]

    name = hostname or socket.gethostname()
    driver = optional(nvml, nvml.nvmlSystemGetDriverVersion)
    gpu_docs = [g.doc for g in gpus]
    doc = {
        "schema": "gpu-topology/v1",
        "model": _model_name(gpu_docs),
        "variant": f"{n}x {gpu_docs[0]['name'] if n else 'no GPU'}, discovered on {name}"
                   + (f" (driver {text(driver)})" if driver else ""),
        "host": host,
        "nvlink": {"fabric": nv.fabric, "switches": nv.switches,
                   "links_per_gpu": nv.links_per_gpu, "generation": nv.generation},
        "pcie_switches": switches,
        "gpus": gpu_docs,
        "nics": nic_docs,
        "topo_matrix": {"columns": labels, "rows": rows},
    }
    return Topology.model_validate(doc)
