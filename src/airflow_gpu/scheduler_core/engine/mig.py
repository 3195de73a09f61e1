"""MIG (Multi-Instance GPU): NVIDIA's profiles per GPU, layouts checked against a GPU's
slices, and a host's MIG devices compiled for the engine (one exclusive unit each).

A GPU in MIG mode has 8 memory slices and 7 compute slices. A GPU instance profile
takes a run of memory slices starting at one of its allowed placements (NVML's
`nvmlGpuInstancePlacement_t`: start, size), as `nvidia-smi mig -lgipp` lists them. The
profile names and placements below are the MIG user guide's ("Supported MIG Profiles")
for A100 40 GB, A100 80 GB, H100 80 GB and H200 141 GB; the media-extension variants
(`+me`) are left out.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from fractions import Fraction

from .topology import MigInstance, Topology

GPU_MEMORY_SLICES = 8
GPU_COMPUTE_SLICES = 7
GiB = 2**30


@dataclass(frozen=True)
class Profile:
    name: str              # e.g. 1g.10gb
    compute: int           # compute slices (the "1g")
    size: int              # memory slices (NVML placement size)
    starts: tuple[int, ...]   # allowed placement starts
    nvml_index: int        # NVML_GPU_INSTANCE_PROFILE_* (nvmlDeviceGetGpuInstanceProfileInfo)
    nvml_id: int           # the profile id nvidia-smi shows (GPU instance info's profileId)

    @property
    def memory_gb(self) -> int:
        return int(self.name.rsplit(".", 1)[1].removesuffix("gb"))


# (compute, memory slices, starts, NVML_GPU_INSTANCE_PROFILE_*, profile id): the same
# shape on every GPU here, only the memory in the names differs
_SHAPES = ((1, 1, (0, 1, 2, 3, 4, 5, 6), 0x0, 19),     # 1_SLICE
           (1, 2, (0, 2, 4, 6), 0x9, 15),              # 1_SLICE_REV2 (twice the memory)
           (2, 2, (0, 2, 4), 0x1, 14),                 # 2_SLICE
           (3, 4, (0, 4), 0x2, 9),                     # 3_SLICE
           (4, 4, (0,), 0x3, 5),                       # 4_SLICE
           (7, 8, (0,), 0x4, 0))                       # 7_SLICE
_NAMES = {
    "A100 40GB": ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100 80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100 80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H200 141GB": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}
FAMILIES: dict[str, dict[str, Profile]] = {
    family: {n: Profile(n, *shape) for n, shape in zip(names, _SHAPES, strict=True)}
    for family, names in _NAMES.items()}
ALL_PROFILES: tuple[str, ...] = tuple(sorted({n for names in _NAMES.values() for n in names},
                                             key=lambda n: (int(n[0]), float(n[3:-2]))))


def gpu_share(profile: str) -> Fraction:
    """A MIG device's share of its GPU as quotas, fair share and accounting charge it: its
    compute slices / 7 (a 3g.40gb device is 3/7 GPU). Exact, so seven 1g devices make
    one GPU and not a hair more; 0 for a name that is no profile (a stored bad spec)."""
    head = profile.split("g.", 1)[0]
    return Fraction(int(head), GPU_COMPUTE_SLICES) if head.isdigit() else Fraction(0)


def family_of(gpu_name: str, memory_bytes: int) -> str | None:
    """The MIG family of a GPU by its NVML name and memory, or None (no MIG: V100...)."""
    name = gpu_name.upper()
    if "A100" in name:
        return "A100 80GB" if memory_bytes > 48 * GiB else "A100 40GB"
    if "H100" in name:
        return "H100 80GB"
    if "H200" in name:
        return "H200 141GB"
    return None


def profiles_of(gpu_name: str, memory_bytes: int) -> dict[str, Profile]:
    return FAMILIES.get(family_of(gpu_name, memory_bytes) or "", {})


def closest_profile(value: str, known: tuple[str, ...] | list[str]) -> str | None:
    """The likeliest meant profile: one with the same compute slices ("3g.") first."""
    same = [n for n in known if n.split(".")[0] == value.split(".")[0]]
    close = difflib.get_close_matches(value, same, n=1, cutoff=0.0) if same else []
    return (close or difflib.get_close_matches(value, list(known), n=1) or [None])[0]


def unknown_profile(value: str, known: tuple[str, ...] | list[str] = ALL_PROFILES,
                    of: str = "") -> str:
    """The message for a profile name that is not one of `known` (with did-you-mean)."""
    close = closest_profile(value, known)
    hint = f"; did you mean '{close}'?" if close else ""
    return (f"{value!r} is not a MIG profile{of}{hint} (profiles: {', '.join(known)})")


def place_layout(profiles: dict[str, Profile], layout: list[str],
                 starts: list[int | None] | None = None) -> list[int]:
    """Placement starts for the GPU instances of `layout` on one GPU (given `starts`
    where known), or ValueError saying why the GPU cannot hold them."""
    for name in layout:
        if name not in profiles:
            raise ValueError(unknown_profile(name, list(profiles)))
    compute = sum(profiles[n].compute for n in layout)
    memory = sum(profiles[n].size for n in layout)
    if compute > GPU_COMPUTE_SLICES or memory > GPU_MEMORY_SLICES:
        raise ValueError(f"{' + '.join(layout)} needs {compute} compute and {memory} memory "
                         f"slices, a GPU has {GPU_COMPUTE_SLICES} and {GPU_MEMORY_SLICES}; "
                         "use fewer or smaller instances")
    starts = list(starts) if starts else [None] * len(layout)
    # largest first: they have the fewest placements
    order = sorted(range(len(layout)), key=lambda i: (-profiles[layout[i]].size, i))
    found: list[int] = [0] * len(layout)

    def fit(k: int, used: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        p = profiles[layout[i]]
        for s in p.starts if starts[i] is None else (starts[i],):
            span = ((1 << p.size) - 1) << s
            if s in p.starts and not used & span and fit(k + 1, used | span):
                found[i] = s
                return True
        return False

    if not fit(0, 0):
        raise ValueError(f"{' + '.join(layout)} cannot be placed on one GPU (the "
                         "instances' allowed placements overlap); see nvidia-smi mig -lgipp "
                         "and choose another layout")
    return found


def expand_layout(layout: list[str] | dict[str, int]) -> list[str]:
    """A layout as a list of profile names (a mapping is profile -> count, as in
    nvidia-mig-parted's `mig-devices`)."""
    if isinstance(layout, dict):
        return [name for name, n in layout.items() for _ in range(n)]
    return list(layout)


_WITH: dict[tuple, Topology] = {}


def with_layout(topo: Topology, layouts: dict[int, list[str]]) -> Topology:
    """`topo` with these GPUs in MIG mode and their instances declared (no UUIDs): one
    object per (model, layout), so hosts of one layout share one compiled type. Raises
    ValueError naming the GPU when a layout does not fit it."""
    key = (id(topo), tuple(sorted((g, tuple(v)) for g, v in layouts.items())))
    found = _WITH.get(key)
    if found is not None and found.model == topo.model:
        return found
    gpus = []
    for g in topo.gpus:
        if g.index not in layouts:
            gpus.append(g)
            continue
        profiles = profiles_of(g.name, g.memory_mb * 2**20)
        if not profiles:
            raise ValueError(f"GPU {g.index} ({g.name}) has no MIG mode")
        try:
            starts = place_layout(profiles, layouts[g.index])
        except ValueError as exc:
            raise ValueError(f"GPU {g.index} ({g.name}): {exc}") from None
        inst = [MigInstance(profile=n, start=s) for n, s in zip(layouts[g.index], starts,
                                                                 strict=True)]
        gpus.append(g.model_copy(update={"mig_mode": True, "mig_instances": inst}))
    _WITH[key] = out = topo.model_copy(update={"gpus": gpus})
    return out


def has_mig_report(topo: Topology) -> bool:
    """Whether the model says anything of MIG (a discovered host does: mig_mode is set);
    a declared model (mig_mode unset everywhere) leaves the cluster file's layout."""
    return any(g.mig_mode is not None for g in topo.gpus)


@dataclass(frozen=True)
class Slice:
    """One MIG device of a host: an exclusive unit the engine hands out."""

    slot: int               # position among the host's MIG devices (bit in the masks)
    gpu: int
    index: int              # position among its GPU's MIG devices (nvidia-smi -L "Device N")
    profile: str
    start: int | None
    uuid: str | None
    numa: int               # NUMA position of its GPU

    @property
    def label(self) -> str:
        return f"GPU {self.gpu} MIG {self.profile} #{self.index}"

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "index": self.index, "profile": self.profile,
                "start": self.start, "uuid": self.uuid, "label": self.label}


@dataclass(eq=False)
class MigLayout:
    """A host model's MIG devices compiled into bitmasks over their slots."""

    slices: tuple[Slice, ...]
    gpus: int                       # GPUs in MIG mode (never handed out whole)
    all: int                        # every slot
    by_gpu: dict[int, int]          # GPU -> its slots
    by_profile: dict[str, int]      # profile -> its slots

    def of_gpus(self, gpu_mask: int) -> int:
        """The slots of the GPUs in `gpu_mask`."""
        return sum(m for g, m in self.by_gpu.items() if gpu_mask >> g & 1)

    def profiles(self) -> list[str]:
        return sorted(self.by_profile, key=lambda n: (n[0], len(n), n))


def compile_mig(topo: Topology, gpu_numa: list[int]) -> MigLayout | None:
    """The MIG devices of a model (None when no GPU is in MIG mode)."""
    gpus = sorted(topo.gpus, key=lambda g: g.index)
    if not any(g.mig_mode or g.mig_instances for g in gpus):
        return None
    slices: list[Slice] = []
    mode = every = 0
    by_gpu: dict[int, int] = {}
    by_profile: dict[str, int] = {}
    for g in gpus:
        if not (g.mig_mode or g.mig_instances):
            continue
        mode |= 1 << g.index
        for k, inst in enumerate(g.mig_instances):
            s = Slice(len(slices), g.index, k, inst.profile, inst.start, inst.uuid,
                      gpu_numa[g.index])
            slices.append(s)
            by_gpu[g.index] = by_gpu.get(g.index, 0) | 1 << s.slot
            by_profile[s.profile] = by_profile.get(s.profile, 0) | 1 << s.slot
            every |= 1 << s.slot
    return MigLayout(tuple(slices), mode, every, by_gpu, by_profile)


def slice_labels(layout: MigLayout | None, mask: int) -> list[str]:
    if layout is None:
        return []
    return [s.label for s in layout.slices if mask >> s.slot & 1]


def mig_slots(layout: MigLayout | None, held: list[dict] | None) -> int:
    """The slots of the MIG devices an allocation holds as stored ({gpu, index, profile}
    each; a device the layout no longer has is left out)."""
    if not held or layout is None:
        return 0
    slots = {(s.gpu, s.index, s.profile): s.slot for s in layout.slices}
    return sum(1 << slots[k] for m in held
               if (k := (m["gpu"], m["index"], m["profile"])) in slots)
