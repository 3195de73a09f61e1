"""A host model's matrix in the style of `nvidia-smi topo -m`, so admins can hold it next
to NVIDIA's own output: GPU (and, when discovered, NIC) rows, GPU and NIC columns, then
each GPU's CPU and NUMA affinity."""

from __future__ import annotations

from ..scheduler_core.engine.topology import Topology, format_cpulist

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""  # noqa: E501  (NVIDIA's wording)


def matrix_rows(topo: Topology) -> tuple[list[str], dict[str, list[str]]]:
    """(columns, rows) of the model's matrix; a model without one gets it from its
    NVLink peers and PCIe groups (GPU rows only)."""
    if topo.topo_matrix is not None:
        return list(topo.topo_matrix.columns), dict(topo.topo_matrix.rows)
    gpus = sorted(topo.gpus, key=lambda g: g.index)
    columns = [f"GPU{g.index}" for g in gpus] + [n.name for n in topo.nics]
    rows = {}
    for g in gpus:
        row = []
        for other in gpus:
            links = g.nvlink_peers.get(other.index, 0)
            row.append("X" if other.index == g.index else f"NV{links}" if links
                       else "PIX" if other.pcie_switch == g.pcie_switch
                       else "NODE" if other.numa_node == g.numa_node else "SYS")
        for nic in topo.nics:
            row.append("PIX" if g.index in nic.pix_gpus else "PXB" if g.index in nic.pxb_gpus
                       else "NODE" if nic.numa_node == g.numa_node else "SYS")
        rows[f"GPU{g.index}"] = row
    return columns, rows


def topo_text(topo: Topology) -> str:
    columns, rows = matrix_rows(topo)
    gpus = {f"GPU{g.index}": g for g in topo.gpus}
    width = max(6, *(len(c) + 2 for c in [*columns, *rows]))
    head = "".ljust(width) + "".join(c.ljust(width) for c in columns)
    # Grace systems expose each GPU's memory as a NUMA node: shown as nvidia-smi does
    gpu_numa = any(g.gpu_numa_id is not None for g in topo.gpus)
    lines = [f"{head}CPU Affinity".ljust(len(head) + 16) + "NUMA Affinity"
             + ("   GPU NUMA ID" if gpu_numa else "")]
    for label, cells in rows.items():
        line = label.ljust(width) + "".join(c.ljust(width) for c in cells)
        g = gpus.get(label)
        if g is not None:
            line += format_cpulist(g.cpu_affinity).ljust(16) + str(g.numa_node)
            if gpu_numa:
                line = line.ljust(len(head) + 16 + 16) + (
                    "N/A" if g.gpu_numa_id is None else str(g.gpu_numa_id))
        lines.append(line.rstrip())
    title = f"{topo.model}: {topo.variant}" if topo.variant else topo.model
    out = [title, "", *lines]
    nv = topo.nvlink
    if nv.domain_gpus:
        out += ["", f"NVLink {nv.generation or ''}: {nv.links_per_gpu} links per GPU into a "
                f"{nv.domain_gpus}-GPU NVLink domain beyond this host (the cluster file's "
                "nvlink_domain names which hosts share it)".replace("NVLink :", "NVLink:")]
    return "\n".join([*out, LEGEND])
