"""Host models: the `gpu-topology/v1` format, cpulists, and the built-in DGX models."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ..errors import InputError, load_yaml, validate

MAX_CPU = 65535      # highest logical CPU id a host model may name (Linux NR_CPUS is 8192)


def parse_cpulist(text: str | int) -> list[int]:
    """Linux cpulist (`0-15,128-143`) to a sorted list of CPU ids."""
    if isinstance(text, int):
        return [text]
    cpus: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"not a cpulist: {text!r} (expected e.g. '0-15,128-143')") from None
        if last < first or first < 0:
            raise ValueError(f"bad range {part!r} in cpulist {text!r}")
        if last > MAX_CPU:
            raise ValueError(f"cpu {last} in cpulist {text!r} is over the limit of {MAX_CPU}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: list[int]) -> str:
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


# A Linux cpulist string ('0-15,128-143') or a list of CPU ids.
CpuList = Annotated[list[int], BeforeValidator(
    lambda v: parse_cpulist(v) if isinstance(v, str | int) else v)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NumaNode(_Model):
    id: int = Field(ge=0)
    socket: int = Field(ge=0)
    cpus: CpuList
    memory_gb: float = Field(ge=0)


class HostInfo(_Model):
    cpu_model: str
    sockets: int = Field(ge=1)
    cores_per_socket: int = Field(ge=1)
    threads_per_core: int = Field(ge=1)
    total_cores: int = Field(ge=1)
    total_threads: int = Field(ge=1)
    memory_gb: float = Field(ge=0)
    numa_per_socket: int | None = None
    numa_nodes: list[NumaNode] = Field(min_length=1)
    # The logical CPUs of each physical core (Linux's thread_siblings_list), where they
    # are not the usual numbering: with two threads per core, CPU i and i + total_cores
    # share a core (so on every DGX model); with one, each CPU is a core of its own.
    thread_siblings: list[CpuList] | None = None

    def cores(self) -> list[list[int]]:
        """The physical cores, each as its logical CPUs, lowest CPU first."""
        cpus = sorted(c for n in self.numa_nodes for c in n.cpus)
        if self.thread_siblings is not None:
            groups = [sorted(g) for g in self.thread_siblings]
        elif self.threads_per_core == 2 and self.total_threads == 2 * self.total_cores:
            known = set(cpus)
            groups = [[c, c + self.total_cores] for c in cpus if c < self.total_cores
                      and c + self.total_cores in known]
        else:
            groups = []
        grouped = {c for g in groups for c in g}
        return sorted(groups + [[c] for c in cpus if c not in grouped])


class NvLink(_Model):
    fabric: Literal["direct", "nvswitch", "none"]
    switches: int | None = None
    links_per_gpu: int = 0
    generation: int | None = None
    # GPUs of the multi-node NVLink domain this host's GPUs join through NVLink switches
    # outside the host (GB200 NVL72: 72, one rack); None: NVLink stays inside the host.
    # Which hosts share a domain is the cluster file's `nvlink_domain`.
    domain_gpus: int | None = Field(None, ge=1)


class PcieSwitch(_Model):
    id: str
    numa_node: int | None = None
    parent: str | None = None
    members: list[str] = []


class MigInstance(_Model):
    """One MIG device of a GPU: a GPU instance (and its compute instance), in NVML's
    order of MIG devices (nvmlDeviceGetMigDeviceHandleByIndex)."""

    profile: str = Field(min_length=1, max_length=40)   # e.g. 1g.10gb
    start: int | None = Field(None, ge=0, le=7)         # first memory slice (placement)
    uuid: str | None = Field(None, max_length=100)      # MIG-..., where NVML reported it
    gpu_instance: int | None = Field(None, ge=0)
    compute_instance: int | None = Field(None, ge=0)


class Gpu(_Model):
    index: int = Field(ge=0)
    name: str
    memory_mb: int = Field(gt=0)
    numa_node: int
    cpu_affinity: CpuList
    pcie_switch: str
    nvlink_peers: dict[int, int] = {}
    uuid: str | None = None
    pci_bus_id: str | None = None
    mig_mode: bool | None = None     # discovered hosts: MIG enabled on this GPU
    # its MIG devices (reported by the node agent, or declared in the cluster file)
    mig_instances: list[MigInstance] = Field([], max_length=16)   # NVML: at most 7 today
    # NUMA node of the GPU's own memory where the OS exposes it as one (Grace systems:
    # nvidia-smi topo -m's "GPU NUMA ID"); not a node of host.numa_nodes, never booked.
    gpu_numa_id: int | None = Field(None, ge=0)


class Nic(_Model):
    name: str
    role: Literal["compute", "storage", "storage_inband", "ethernet"]
    port_speed_gbps: float | None = None
    numa_node: int | None = None
    pcie_switch: str | None = None
    pix_gpus: list[int] = []
    pxb_gpus: list[int] = []
    netdev: str | None = None
    pci_bus: str | None = None
    osfp_port: str | None = None


class TopoMatrix(_Model):
    columns: list[str]
    rows: dict[str, list[str]]


class Topology(_Model):
    """One host model in the `gpu-topology/v1` format (built-in or a user's file)."""

    schema_: Literal["gpu-topology/v1"] = Field(alias="schema")
    model: str
    variant: str = ""
    host: HostInfo
    nvlink: NvLink
    pcie_switches: list[PcieSwitch] = []
    gpus: list[Gpu]
    nics: list[Nic] = []
    topo_matrix: TopoMatrix | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        numa_ids = {n.id for n in self.host.numa_nodes}
        switch_ids = {s.id for s in self.pcie_switches}
        indexes = [g.index for g in self.gpus]
        if sorted(indexes) != list(range(len(indexes))):
            raise ValueError(f"gpus: indexes must be 0..{len(indexes) - 1}, got {indexes}")
        seen: dict[int, int] = {}
        self._check_siblings()
        for n in self.host.numa_nodes:
            for cpu in n.cpus:
                if not 0 <= cpu <= MAX_CPU:
                    raise ValueError(f"host.numa_nodes: cpu {cpu} of node {n.id} is not a "
                                     f"CPU id (0-{MAX_CPU})")
                if cpu in seen:
                    raise ValueError(f"host.numa_nodes: cpu {cpu} is in nodes {seen[cpu]} "
                                     f"and {n.id}")
                seen[cpu] = n.id
        for g in self.gpus:
            if g.numa_node not in numa_ids:
                raise ValueError(f"gpus[{g.index}].numa_node: {g.numa_node} is not one of "
                                 f"host.numa_nodes {sorted(numa_ids)}")
            if switch_ids and g.pcie_switch not in switch_ids:
                raise ValueError(f"gpus[{g.index}].pcie_switch: {g.pcie_switch!r} is not one of "
                                 f"pcie_switches {sorted(switch_ids)}")
            for peer, links in g.nvlink_peers.items():
                if peer not in indexes or peer == g.index:
                    raise ValueError(f"gpus[{g.index}].nvlink_peers: no GPU {peer}")
                back = self.gpus[indexes.index(peer)].nvlink_peers.get(g.index)
                if back != links:
                    raise ValueError(f"gpus[{g.index}].nvlink_peers: {g.index}->{peer} has "
                                     f"{links} links but {peer}->{g.index} has {back}; "
                                     "NVLink peers must be symmetric")
        domain = self.nvlink.domain_gpus
        if domain is not None and domain < len(indexes):
            raise ValueError(f"nvlink.domain_gpus: {domain} is fewer than the host's own "
                             f"{len(indexes)} GPUs; give the GPUs of the whole NVLink domain "
                             "(e.g. 72 for a GB200 NVL72 rack) or leave it out")
        for nic in self.nics:
            for gi in nic.pix_gpus + nic.pxb_gpus:
                if gi not in indexes:
                    raise ValueError(f"nics {nic.name}: no GPU {gi}")
        return self

    def _check_siblings(self) -> None:
        node = {c: n.id for n in self.host.numa_nodes for c in n.cpus}
        owner: dict[int, int] = {}
        for i, group in enumerate(self.host.thread_siblings or ()):
            if not group:
                raise ValueError(f"host.thread_siblings[{i}]: a core has at least one CPU, "
                                 "e.g. \"0,112\"")
            for cpu in group:
                if cpu not in node:
                    raise ValueError(f"host.thread_siblings[{i}]: cpu {cpu} is in no NUMA "
                                     "node of host.numa_nodes")
                if cpu in owner:
                    raise ValueError(f"host.thread_siblings: cpu {cpu} is in cores "
                                     f"{owner[cpu]} and {i}; a CPU belongs to one core")
                owner[cpu] = i
            if len({node[c] for c in group}) > 1:
                raise ValueError(f"host.thread_siblings[{i}]: the CPUs of one core are on "
                                 "different NUMA nodes")

    def document(self) -> dict:
        """The model as a `gpu-topology/v1` document (JSON-ready, cpulists as strings), the
        form node agents send and the built-in files use."""
        doc = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for n in doc["host"]["numa_nodes"]:
            n["cpus"] = format_cpulist(n["cpus"])
        if "thread_siblings" in doc["host"]:
            doc["host"]["thread_siblings"] = [format_cpulist(g)
                                              for g in doc["host"]["thread_siblings"]]
        for g in doc["gpus"]:
            g["cpu_affinity"] = format_cpulist(g["cpu_affinity"])
            if not g.get("mig_instances"):     # GPUs without MIG read as before
                g.pop("mig_instances", None)
        return doc

    def gpu_local_nics(self, gpu: int, role: str = "compute") -> list[str]:
        """NICs of `role` behind the GPU's PCIe switch (PIX/PXB), else on its NUMA node.
        Where the GPUs behind one switch have a NIC each (a DGX A100: 2 GPUs, 2 HCAs),
        each GPU gets its own, in index and file order, so two 1-GPU replicas there do
        not share one; a 2-GPU replica still gets both."""
        near = self._switch_nics(gpu, role)
        if not near:
            g = self.gpus[gpu]
            return [n.name for n in self.nics if n.role == role and n.numa_node == g.numa_node]
        peers = [i for i in range(len(self.gpus)) if self._switch_nics(i, role) == near]
        if len(near) % len(peers):
            return near          # fewer NICs than GPUs (a DGX-1): they share them
        each = len(near) // len(peers)
        k = peers.index(gpu)
        return near[k * each:(k + 1) * each]

    def _switch_nics(self, gpu: int, role: str) -> list[str]:
        g = self.gpus[gpu]
        return [n.name for n in self.nics if n.role == role and (
            gpu in n.pix_gpus or gpu in n.pxb_gpus
            or (n.pcie_switch is not None and n.pcie_switch == g.pcie_switch))]


_BUILTIN = resources.files(__package__) / "hostmodels"


def builtin_model_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in _BUILTIN.iterdir()
                  if p.name.endswith(".yaml"))


@functools.cache
def _load_builtin(name: str) -> Topology:
    path = _BUILTIN / f"{name}.yaml"
    return validate(Topology, load_yaml(Path(str(path))), f"built-in model {name}")


@functools.cache
def _load_file(path: str) -> Topology:
    return validate(Topology, load_yaml(path), path)


def load_topology(name_or_path: str, base_dir: Path | None = None) -> Topology:
    """A built-in model by name (`dgx-a100`) or a `gpu-topology/v1` file by path."""
    if name_or_path in builtin_model_names():
        return _load_builtin(name_or_path)
    looks_like_path = name_or_path.endswith((".yaml", ".yml", ".json")) or "/" in name_or_path
    if not looks_like_path:
        raise InputError(f"unknown host model {name_or_path!r}; use one of "
                         f"{', '.join(builtin_model_names())} or a path to a "
                         "gpu-topology/v1 file")
    path = Path(name_or_path)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return _load_file(str(path.resolve()))
