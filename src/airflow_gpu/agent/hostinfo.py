"""CPUs, sockets, NUMA nodes and memory of this host, from sysfs and /proc (the `host`
part of a gpu-topology/v1 document)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from ..scheduler_core.engine.topology import format_cpulist, parse_cpulist
from .pcie import read_int

KIB_PER_GIB = 2**20


def _memtotal_gib(meminfo: Path) -> float:
    """MemTotal of a meminfo file, in GiB rounded down to 0.1 (never promise more)."""
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", meminfo.read_text())
    except OSError:
        return 0.0
    return math.floor(int(m.group(1)) / KIB_PER_GIB * 10) / 10 if m else 0.0


def _cpu_model(procfs: Path) -> str:
    try:
        for line in (procfs / "cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model name"):
                return value.strip()
    except OSError:
        pass
    return "unknown"


def read_host(sysfs: Path = Path("/sys"), procfs: Path = Path("/proc")) -> dict:
    """The host section: CPU model, sockets, cores, threads, memory and NUMA nodes."""
    cpu_dir = sysfs / "devices" / "system" / "cpu"
    try:
        online = parse_cpulist((cpu_dir / "online").read_text().strip())
    except (OSError, ValueError):
        online = sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*"))
    package: dict[int, int] = {}
    cores: dict[tuple[int, int], list[int]] = {}     # (package, core_id) -> its CPUs
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        pkg = read_int(topo / "physical_package_id")
        package[cpu] = 0 if pkg is None or pkg < 0 else pkg
        core = read_int(topo / "core_id")
        cores.setdefault((package[cpu], cpu if core is None else core), []).append(cpu)
    nodes = []
    for node_dir in sorted((sysfs / "devices" / "system" / "node").glob("node[0-9]*"),
                           key=lambda p: int(p.name[4:])):
        try:
            cpus = [c for c in parse_cpulist((node_dir / "cpulist").read_text().strip())
                    if c in package]
        except (OSError, ValueError):
            continue
        if not cpus:            # memory-only nodes hold no cores to place work on
            continue
        nodes.append({"id": int(node_dir.name[4:]), "socket": package[cpus[0]],
                      "cpus": format_cpulist(cpus),
                      "memory_gb": _memtotal_gib(node_dir / "meminfo")})
    if not nodes:               # a kernel without NUMA: one node with everything
        nodes = [{"id": 0, "socket": 0, "cpus": format_cpulist(online),
                  "memory_gb": _memtotal_gib(procfs / "meminfo")}]
    sockets = len(set(package.values())) or 1
    total_cores = len(cores) or len(online)
    host = {
        "cpu_model": _cpu_model(procfs),
        "sockets": sockets,
        "cores_per_socket": max(1, total_cores // sockets),
        "threads_per_core": max(1, round(len(online) / total_cores)),
        "total_cores": total_cores,
        "total_threads": len(online),
        "memory_gb": round(sum(n["memory_gb"] for n in nodes), 1),
        "numa_nodes": nodes,
    }
    siblings = sorted(sorted(g) for g in cores.values())
    if siblings != _usual_siblings(online, total_cores):
        host["thread_siblings"] = [format_cpulist(g) for g in siblings]
    return host


def _usual_siblings(online: list[int], total_cores: int) -> list[list[int]]:
    """The cores a topology file implies without thread_siblings: CPU i and i + cores
    with two threads per core, else one CPU per core."""
    if len(online) == 2 * total_cores:
        known = set(online)
        pairs = [[c, c + total_cores] for c in online
                 if c < total_cores and c + total_cores in known]
        if len(pairs) == total_cores:
            return pairs
    return [[c] for c in online]
