"""MIG devices of a GPU in MIG mode, as NVML shows them: one entry per MIG device (a
GPU instance and its compute instance), in NVML's order of MIG devices, with its UUID
(`MIG-...`), profile, placement and instance ids.

The profile's name comes from the GPU instance's profile id
(nvmlDeviceGetGpuInstanceById + nvmlGpuInstanceGetInfo, then
nvmlDeviceGetGpuInstanceProfileInfo's name). Those need a privileged user on some
drivers; without them the name is matched from the MIG device's own attributes
(nvmlDeviceGetAttributes: slices and memory) against NVIDIA's profiles for the GPU,
and the placement stays unknown. A compute instance smaller than its GPU instance is
named as nvidia-smi does (`1c.3g.20gb`).
"""

from __future__ import annotations

from ..scheduler_core.engine.mig import profiles_of
from .nvmlcalls import optional, text

MiB = 2**20


def _profile_names(nvml, h) -> dict[int, str]:
    """GPU instance profile id -> name (e.g. 19 -> 1g.5gb), as far as NVML tells."""
    out: dict[int, str] = {}
    for p in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = optional(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, p)
        if info is not None:
            out[int(info.id)] = text(info.name).removeprefix("MIG ").strip()
    return out


def _by_attributes(nvml, mh, gpu_name: str, memory: int) -> tuple[str | None, int, int]:
    """(profile matched from the device's attributes, GPU instance and compute instance
    slices)."""
    attrs = optional(nvml, nvml.nvmlDeviceGetAttributes, mh)
    if attrs is None:
        return None, 0, 0
    gi, ci = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
    gb = int(attrs.memorySizeMB) / 1024
    fits = [p for p in profiles_of(gpu_name, memory).values() if p.compute == gi]
    best = min(fits, key=lambda p: abs(p.memory_gb - gb), default=None)
    return (best.name if best else f"{gi}g.{round(gb)}gb"), gi, ci


def read_mig(nvml, h, gpu_name: str, memory: int) -> list[dict]:
    """The MIG devices of GPU handle `h` (MIG mode on), as `mig_instances` entries."""
    names = _profile_names(nvml, h)
    count = optional(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0
    out = []
    for i in range(count):
        try:
            mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            continue       # no MIG device at this index
        gi = optional(nvml, nvml.nvmlDeviceGetGpuInstanceId, mh)
        ci = optional(nvml, nvml.nvmlDeviceGetComputeInstanceId, mh)
        profile, start = None, None
        if gi is not None:
            handle = optional(nvml, nvml.nvmlDeviceGetGpuInstanceById, h, gi)
            info = optional(nvml, nvml.nvmlGpuInstanceGetInfo, handle) if handle else None
            if info is not None:
                profile, start = names.get(int(info.profileId)), int(info.placement.start)
        matched, gi_slices, ci_slices = _by_attributes(nvml, mh, gpu_name, memory)
        profile = profile or matched or "unknown"
        if 0 < ci_slices < gi_slices:
            profile = f"{ci_slices}c.{profile}"
        out.append({"profile": profile, "start": start,
                    "uuid": text(nvml.nvmlDeviceGetUUID(mh)),
                    "gpu_instance": gi, "compute_instance": ci})
    return out
