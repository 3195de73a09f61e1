"""A host model compiled for the engine: bitmasks, NUMA positions, GPU locality tree.

Built once per model and shared by every host of that model, so the engine's
hot path works on ints and lists, never on pydantic objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .mig import MigLayout, compile_mig
from .topology import Topology

GiB = 2**30
MiB = 2**20

# Levels of the GPU locality tree, tightest first.
LEVEL_NAMES = ("pcie-switch", "pcie-parent", "numa-node", "socket", "host")


def bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def round_robin(masks: list[int], count: int) -> int | None:
    """`count` bits taken one at a time from each mask in turn (lowest first), or None."""
    picked = 0
    while count and any(m & ~picked for m in masks):
        for m in masks:
            rest = m & ~picked
            if count and rest:
                picked |= rest & -rest
                count -= 1
    return None if count else picked


def lowest_bits(mask: int, count: int) -> int:
    """The `count` lowest set bits of `mask`."""
    out = 0
    for _ in range(count):
        low = mask & -mask
        out |= low
        mask ^= low
    return out


class Cores(tuple):
    """One NUMA node's physical cores as CPU masks, lowest CPU first, with fast paths for
    the usual layouts (every core one CPU; every core CPU i and i + shift, as on DGX)."""

    def __new__(cls, masks):
        self = super().__new__(cls, masks)
        self.all = sum(masks)
        self.singles = all(m.bit_count() == 1 for m in masks)
        firsts = [m & -m for m in masks]
        shifts = {(m ^ f).bit_length() - f.bit_length() for m, f in zip(masks, firsts,
                                                                         strict=True)}
        pairs = all(m.bit_count() == 2 for m in masks) and len(shifts) == 1
        self.shift = shifts.pop() if pairs else 0
        self.firsts = sum(firsts)
        return self

    def free(self, avail: int) -> int:
        """Logical CPUs in the cores whose every CPU is in `avail`."""
        if self.singles:
            return (avail & self.all).bit_count()
        if self.shift:
            return 2 * (avail & (avail >> self.shift) & self.firsts).bit_count()
        return sum(c.bit_count() for c in self if c & avail == c)

    def take(self, avail: int, want: int) -> int:
        """At least `want` CPUs as whole free cores, lowest first (fewer if not free)."""
        if self.singles:
            return lowest_bits(avail & self.all, want)
        if self.shift:
            low = lowest_bits(avail & (avail >> self.shift) & self.firsts, (want + 1) // 2)
            return low | low << self.shift
        out = n = 0
        for c in self:
            if n >= want:
                break
            if c & avail == c:
                out |= c
                n += c.bit_count()
        return out


@dataclass(eq=False)
class TreeNode:
    level: int
    name: str
    mask: int
    children: list[TreeNode] = field(default_factory=list)


@dataclass(eq=False)
class HostType:
    topo: Topology
    model: str
    n_gpus: int
    gpu_name: list[str]
    gpu_mem: list[int]              # bytes
    gpu_numa: list[int]             # NUMA position (index into numa_ids)
    gpu_switch: list[str]
    gpu_nics: list[list[str]]       # compute NICs behind each GPU
    links: list[list[int]]          # NVLink count between GPU pairs
    fabric: str
    numa_ids: list[int]             # real NUMA node ids, by position
    numa_socket: list[int]
    numa_cpus: list[int]            # bitmask of logical CPU ids per NUMA position
    numa_cores: list[Cores]         # per NUMA position, its physical cores as CPU masks
    numa_mem: list[int]             # bytes per NUMA position
    numa_gpus: list[int]            # bitmask of GPUs local to each NUMA position
    tree: TreeNode
    all_gpus: int
    total_cpus: int
    total_mem: int
    # (free_mask, count[, worn_mask]) -> GPU sets best first; shared by all hosts of this
    # model (gpu_selection.ranked_gpu_sets). The worn mask (within free) is in the key
    # only when it is not empty.
    _ranked: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    # GPUs in MIG mode and their MIG devices (mig.py); None: no GPU in MIG mode
    mig: MigLayout | None = None

    def describe(self) -> str:
        mem = self.gpu_mem[0] // GiB if self.n_gpus else 0
        name = self.gpu_name[0] if self.n_gpus else "no GPU"
        mig = (f"; GPU {','.join(map(str, bits(self.mig_gpus)))} in MIG mode, "
               f"{len(self.mig.slices)} MIG devices" if self.mig else "")
        return f"{self.model} ({self.n_gpus}x {name}, {mem} GiB each{mig})"

    @property
    def mig_gpus(self) -> int:
        """The GPUs in MIG mode: only their MIG devices are handed out, never them whole."""
        return self.mig.gpus if self.mig is not None else 0


def _build_tree(topo: Topology, numa_pos: dict[int, int]) -> TreeNode:
    def gmask(indexes) -> int:
        return sum(1 << i for i in indexes)

    switches = {s.id: s for s in topo.pcie_switches}

    def switch_chain(gpu) -> list[str]:
        chain, sid = [], gpu.pcie_switch
        while sid is not None and sid not in chain:
            chain.append(sid)
            sid = switches[sid].parent if sid in switches else None
        return chain

    root = TreeNode(4, "host", gmask(g.index for g in topo.gpus))
    by_key: dict[tuple, TreeNode] = {}

    def node(parent: TreeNode, level: int, name: str) -> TreeNode:
        key = (id(parent), level, name)
        if key not in by_key:
            by_key[key] = TreeNode(level, name, 0)
            parent.children.append(by_key[key])
        return by_key[key]

    for g in topo.gpus:
        numa = next(n for n in topo.host.numa_nodes if n.id == g.numa_node)
        cur = node(root, 3, f"socket{numa.socket}")
        cur = node(cur, 2, f"numa{numa.id}")
        for level, sid in reversed(list(enumerate(switch_chain(g)))):
            cur = node(cur, min(level, 1), sid)
        cur.children.append(TreeNode(-1, f"GPU{g.index}", 1 << g.index))

    def fill(n: TreeNode) -> int:
        if n.children:
            n.mask = 0
            for c in n.children:
                n.mask |= fill(c)
        return n.mask

    fill(root)
    return root


def _compile(topo: Topology) -> HostType:
    numa_ids = [n.id for n in topo.host.numa_nodes]
    pos = {nid: i for i, nid in enumerate(numa_ids)}
    n = len(topo.gpus)
    gpus = sorted(topo.gpus, key=lambda g: g.index)
    links = [[0] * n for _ in range(n)]
    for g in gpus:
        for peer, count in g.nvlink_peers.items():
            links[g.index][peer] = count
    numa_gpus = [0] * len(numa_ids)
    for g in gpus:
        numa_gpus[pos[g.numa_node]] |= 1 << g.index
    numa_cpus = [sum(1 << c for c in nn.cpus) for nn in topo.host.numa_nodes]
    numa_cores: list[list[int]] = [[] for _ in numa_ids]
    for core in topo.host.cores():
        mask = sum(1 << c for c in core)
        numa_cores[next(p for p, m in enumerate(numa_cpus) if m & mask)].append(mask)
    return HostType(
        topo=topo,
        model=topo.model,
        n_gpus=n,
        gpu_name=[g.name for g in gpus],
        gpu_mem=[g.memory_mb * MiB for g in gpus],
        gpu_numa=[pos[g.numa_node] for g in gpus],
        gpu_switch=[g.pcie_switch for g in gpus],
        gpu_nics=[topo.gpu_local_nics(g.index) for g in gpus],
        links=links,
        fabric=topo.nvlink.fabric,
        numa_ids=numa_ids,
        numa_socket=[nn.socket for nn in topo.host.numa_nodes],
        numa_cpus=numa_cpus,
        numa_cores=[Cores(cores) for cores in numa_cores],
        numa_mem=[int(nn.memory_gb * GiB) for nn in topo.host.numa_nodes],
        numa_gpus=numa_gpus,
        tree=_build_tree(topo, pos),
        mig=compile_mig(topo, [pos[g.numa_node] for g in gpus]),
        all_gpus=(1 << n) - 1,
        total_cpus=sum(m.bit_count() for m in numa_cpus),
        total_mem=sum(int(nn.memory_gb * GiB) for nn in topo.host.numa_nodes),
    )


_TYPES: dict[int, tuple[Topology, HostType]] = {}


def host_type(topo: Topology) -> HostType:
    """The compiled type of a topology; one per loaded topology object."""
    found = _TYPES.get(id(topo))
    if found is None or found[0] is not topo:
        found = _TYPES[id(topo)] = (topo, _compile(topo))
    return found[1]
