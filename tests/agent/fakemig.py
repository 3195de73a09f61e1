"""MIG for the fake NVML: GPU instances, compute instances and MIG device handles as
pynvml returns them.

A test turns MIG on for a GPU with a layout (`fake.enable_mig(2, ["3g.20gb", "2g.10gb"])`):
the GPU instances are created as the driver does, each at an allowed placement of its
profile (NVIDIA's table, engine/mig.py), each with one compute instance over all its
slices, so each is one MIG device. What pynvml does is kept:
- MIG device handles are `c_nvmlDevice_t` pointers of their own; whole-GPU calls refuse
  them (NVMLError_InvalidArgument), nvmlDeviceGetUUID answers `MIG-...` for them;
- nvmlDeviceGetMigDeviceHandleByIndex answers NVMLError_NotFound for an index with no
  device below nvmlDeviceGetMaxMigDeviceCount, NVMLError_InvalidArgument past it;
- nvmlDeviceIsMigDeviceHandle returns a c_uint (pynvml does not unwrap it);
- GPU instance handles are `c_nvmlGpuInstance_t`; nvmlDeviceGetGpuInstanceById and
  nvmlGpuInstanceGetInfo need a privileged user (`privileged = False`: NoPermission);
- profile info (nvmlDeviceGetGpuInstanceProfileInfo) has v2's `name` ("MIG 1g.5gb"),
  and NVMLError_NotSupported for profiles the GPU does not offer;
- Volta has no MIG: every MIG call answers NVMLError_NotSupported.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass

import pynvml

from airflow_gpu.scheduler_core.engine.mig import (
    GPU_COMPUTE_SLICES,
    GPU_MEMORY_SLICES,
    place_layout,
    profiles_of,
)

MiB = 2**20
MAX_MIG_DEVICES = 7
SMS_PER_SLICE = 14     # A100: 98 SMs over 7 slices (H100: 132 over 7, about 18)


@dataclass
class MigDevice:
    gpu: int
    gpu_instance: int
    compute_instance: int
    profile: str
    start: int
    uuid: str
    struct: object
    gi_struct: object


def mig_uuid(model: str, gpu: int, gi: int) -> str:
    h = hashlib.sha256(f"{model}/{gpu}/mig/{gi}".encode()).hexdigest()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class FakeMig:
    """Mixed into FakeNVML: needs self.gpus, self.topo, self.volta, _gpu and _call."""

    privileged = True

    def _mig_init(self) -> None:
        self.mig: dict[int, list[MigDevice]] = {}
        self._mig_handles: dict[int, MigDevice] = {}
        self._gi_handles: dict[int, MigDevice] = {}

    # -- test controls ------------------------------------------------------------------
    def enable_mig(self, index: int, layout: list[str]) -> list[MigDevice]:
        """MIG mode on for GPU `index`, with these GPU instances (one compute instance
        each); replaces what the GPU had."""
        g = self.gpus[index]
        profiles = profiles_of(g.name, g.memory_mb * MiB)
        starts = place_layout(profiles, layout)
        devices = []
        # the driver numbers GPU instances from 1 (the 7-slice one is 0)
        for n, (name, start) in enumerate(sorted(zip(layout, starts, strict=True),
                                                 key=lambda x: x[1])):
            gi = 0 if profiles[name].compute == GPU_COMPUTE_SLICES else n + 1
            dev = MigDevice(index, gi, 0, name, start, mig_uuid(self.topo.model, index, gi),
                            pynvml.struct_c_nvmlDevice_t(), pynvml.struct_c_nvmlGpuInstance_t())
            devices.append(dev)
        for dev in self.mig.get(index, []):
            self._mig_handles.pop(ctypes.addressof(dev.struct), None)
            self._gi_handles.pop(ctypes.addressof(dev.gi_struct), None)
        self.mig[index] = devices
        for dev in devices:
            self._mig_handles[ctypes.addressof(dev.struct)] = dev
            self._gi_handles[ctypes.addressof(dev.gi_struct)] = dev
        return devices

    # -- plumbing -----------------------------------------------------------------------
    def _mig_device(self, handle) -> MigDevice | None:
        try:
            return self._mig_handles.get(ctypes.addressof(handle.contents))
        except (ValueError, AttributeError):
            return None

    def _mig_dev(self, name: str, handle) -> MigDevice:
        self._call(name)
        dev = self._mig_device(handle)
        if dev is None:
            raise pynvml.NVMLError_InvalidArgument()
        return dev

    def _mig_gpu(self, name: str, handle) -> int:
        i = self._gpu(name, handle)
        if self.volta:
            raise pynvml.NVMLError_NotSupported()
        return i

    def _profiles(self, i: int):
        g = self.gpus[i]
        return profiles_of(g.name, g.memory_mb * MiB)

    # -- MIG mode and devices -----------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle):
        i = self._mig_gpu("nvmlDeviceGetMigMode", handle)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if i in self.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle) -> int:
        i = self._mig_gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return MAX_MIG_DEVICES if i in self.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index: int):
        i = self._mig_gpu("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if i not in self.mig or not 0 <= index < MAX_MIG_DEVICES:
            raise pynvml.NVMLError_InvalidArgument()
        if index >= len(self.mig[i]):
            raise pynvml.NVMLError_NotFound()
        return pynvml.c_nvmlDevice_t(self.mig[i][index].struct)

    def nvmlDeviceIsMigDeviceHandle(self, device):
        self._call("nvmlDeviceIsMigDeviceHandle")
        return ctypes.c_uint(int(self._mig_device(device) is not None))

    def nvmlDeviceGetGpuInstanceId(self, device) -> int:
        return self._mig_dev("nvmlDeviceGetGpuInstanceId", device).gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, device) -> int:
        return self._mig_dev("nvmlDeviceGetComputeInstanceId", device).compute_instance

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice):
        dev = self._mig_dev("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        return pynvml.c_nvmlDevice_t(self._structs[dev.gpu])

    def nvmlDeviceGetAttributes(self, device):
        dev = self._mig_dev("nvmlDeviceGetAttributes", device)
        p = self._profiles(dev.gpu)[dev.profile]
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = p.compute
        attrs.multiprocessorCount = p.compute * SMS_PER_SLICE
        total = self.gpus[dev.gpu].memory_mb
        attrs.memorySizeMB = total * p.size // GPU_MEMORY_SLICES
        return attrs

    # -- GPU instances ------------------------------------------------------------------
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device, profile: int, version: int = 2):
        i = self._mig_gpu("nvmlDeviceGetGpuInstanceProfileInfo", device)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise pynvml.NVMLError_InvalidArgument()
        p = next((p for p in self._profiles(i).values() if p.nvml_index == profile), None)
        if p is None:
            raise pynvml.NVMLError_NotSupported()
        info = (pynvml.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2
                else pynvml.c_nvmlGpuInstanceProfileInfo_t())
        info.id, info.sliceCount = p.nvml_id, p.compute
        info.instanceCount = len(p.starts)
        info.multiprocessorCount = p.compute * SMS_PER_SLICE
        info.memorySizeMB = self.gpus[i].memory_mb * p.size // GPU_MEMORY_SLICES
        if version == 2:
            info.name = f"MIG {p.name}".encode()
        return info

    def nvmlDeviceGetGpuInstanceById(self, device, gpuInstanceId: int):
        i = self._mig_gpu("nvmlDeviceGetGpuInstanceById", device)
        if not self.privileged:
            raise pynvml.NVMLError_NoPermission()
        dev = next((d for d in self.mig.get(i, []) if d.gpu_instance == gpuInstanceId), None)
        if dev is None:
            raise pynvml.NVMLError_NotFound()
        return pynvml.c_nvmlGpuInstance_t(dev.gi_struct)

    def nvmlGpuInstanceGetInfo(self, gpuInstance):
        self._call("nvmlGpuInstanceGetInfo")
        if not self.privileged:
            raise pynvml.NVMLError_NoPermission()
        try:
            dev = self._gi_handles[ctypes.addressof(gpuInstance.contents)]
        except (KeyError, ValueError, AttributeError):
            raise pynvml.NVMLError_InvalidArgument() from None
        p = self._profiles(dev.gpu)[dev.profile]
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = pynvml.c_nvmlDevice_t(self._structs[dev.gpu])
        info.id, info.profileId = dev.gpu_instance, p.nvml_id
        info.placement.start, info.placement.size = dev.start, p.size
        return info
