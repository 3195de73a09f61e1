"""A fake NVML module built from a gpu-topology/v1 model, for the agent's tests.

It answers the pynvml functions the agent calls with pynvml's own types and semantics:
errors are pynvml's NVMLError subclasses (NVMLError_NotSupported, _InvalidArgument,
_Timeout, _GpuIsLost, _Uninitialized ...); handles are `c_nvmlDevice_t` pointers; PCI
info is an `nvmlPciInfo_t` whose bus id has NVML's 8-digit domain in upper case
("00000000:0A:00.0"); CPU and NUMA affinities are arrays of unsigned 64-bit words; on
NVSwitch systems every NVLink's remote end is a switch (NVML_NVLINK_DEVICE_TYPE_SWITCH);
event sets deliver the XIDs and ECC events a test injects; the energy counter (mJ), ECC
and NVLink error counters and clock event reasons read what a test sets. What depends on the GPU's
architecture does too: row remapping and MIG (fakemig.py) exist from Ampere on, pending page
retirement only up to Volta, nvmlDeviceGetNumaNodeId not on x86.

Constants and exception classes are pynvml's (`fake.NVML_TOPOLOGY_SINGLE is
pynvml.NVML_TOPOLOGY_SINGLE`), so code written against pynvml runs unchanged.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass, field

import pynvml

from airflow_gpu.scheduler_core.engine.topology import Topology
from tests.agent.fakemig import FakeMig
from tests.agent.fakesysfs import FakePci

MiB = 2**20
SUPPORTED_EVENTS = (pynvml.nvmlEventTypeSingleBitEccError
                    | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypePState
                    | pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeClock)
NVLINK_VERSION = {1: pynvml.NVML_NVLINK_VERSION_1_0, 2: pynvml.NVML_NVLINK_VERSION_2_0,
                  3: pynvml.NVML_NVLINK_VERSION_3_0, 4: pynvml.NVML_NVLINK_VERSION_4_0,
                  5: pynvml.NVML_NVLINK_VERSION_5_0}
_EXPORTED = ("NVML_", "NVMLError", "nvmlEventType", "nvmlEventMig", "nvmlClocks")
NVLINK_ERROR_COUNTERS = (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                         pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                         pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)


def fake_uuid(model: str, index: int) -> str:
    """A GPU UUID in NVML's form, the same for a model's GPU in every run."""
    h = hashlib.sha256(f"{model}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def nvml_bus_id(bdf: str) -> str:
    """sysfs 0000:0a:00.0 -> NVML 00000000:0A:00.0."""
    domain, bus, devfn = bdf.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{devfn.upper()}"


@dataclass
class GpuState:
    """What a test can change on one GPU."""

    temperature: int = 40
    util_gpu: int = 0
    util_memory: int = 0
    memory_used: int = 512 * MiB
    power_mw: int = 70_000
    ecc_volatile: int = 0            # uncorrected (double-bit) errors since driver load
    ecc_aggregate: int = 0
    ecc_corrected: int = 0           # corrected (single-bit) errors since driver load
    energy_mj: int = 1_234_567_890   # total energy since driver load, millijoules
    clock_reasons: int = 0x1         # nvmlClocksEventReason* bits (0x1: GPU idle)
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter)
    remap_pending: bool = False
    remap_failed: bool = False
    retired_pending: bool = False
    lost: bool = False
    links_down: set[int] = field(default_factory=set)


@dataclass
class _Link:
    kind: int                     # NVML_NVLINK_DEVICE_TYPE_*
    remote_bdf: str


class _EventSet:
    def __init__(self) -> None:
        self.wanted: dict[int, int] = {}     # GPU index -> registered event types
        self.queue: list[tuple[int, int, int]] = []   # (gpu, event type, data)


class FakeNVML(FakeMig):
    def __init__(self, topo: Topology, pci: FakePci | None = None, missing: tuple = (),
                 driver: str = "550.54.15"):
        self.topo = topo
        self.pci = pci or FakePci(topo)
        self.missing = set(missing)      # functions this "driver" lacks
        self.driver = driver
        self.initialized = 0
        self.gpus = sorted(topo.gpus, key=lambda g: g.index)
        self.state = [GpuState() for _ in self.gpus]
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in self.gpus]
        self._index = {ctypes.addressof(s): i for i, s in enumerate(self._structs)}
        self._bdf = [self.pci.by_label(f"GPU{g.index}").bdf for g in self.gpus]
        self._links = self._nvlinks()
        self._sets: dict[int, tuple[object, _EventSet]] = {}
        self._cond = threading.Condition()
        self.volta = any("V100" in g.name for g in self.gpus)
        self._mig_init()          # no GPU in MIG mode until a test enables it (fakemig.py)

    def __getattr__(self, name: str):
        if name.startswith(_EXPORTED):
            return getattr(pynvml, name)
        raise AttributeError(f"the fake NVML has no {name}")

    # -- test controls ------------------------------------------------------------------
    def inject_xid(self, index: int, xid: int) -> None:
        self._event(index, pynvml.nvmlEventTypeXidCriticalError, xid)

    def inject_double_bit_ecc(self, index: int) -> None:
        """An uncorrected ECC error: the counters count it and an event is sent."""
        self.state[index].ecc_volatile += 1
        self.state[index].ecc_aggregate += 1
        self._event(index, pynvml.nvmlEventTypeDoubleBitEccError, 0)

    def add_nvlink_errors(self, index: int, link: int, counter: int, n: int = 1) -> None:
        """Count `n` more errors of an NVML_NVLINK_ERROR_DL_* counter on one link."""
        errors = self.state[index].nvlink_errors
        errors[(link, counter)] = errors.get((link, counter), 0) + n

    def _event(self, index: int, kind: int, data: int) -> None:
        with self._cond:
            for _, es in self._sets.values():
                if es.wanted.get(index, 0) & kind:
                    es.queue.append((index, kind, data))
            self._cond.notify_all()

    # -- plumbing -----------------------------------------------------------------------
    def _call(self, name: str) -> None:
        if name in self.missing:
            raise pynvml.NVMLError_FunctionNotFound()
        if not self.initialized:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, name: str, handle) -> int:
        self._call(name)
        try:
            index = self._index[ctypes.addressof(handle.contents)]
        except (KeyError, ValueError, AttributeError):
            raise pynvml.NVMLError_InvalidArgument() from None
        if self.state[index].lost:
            raise pynvml.NVMLError_GpuIsLost()
        return index

    def _nvlinks(self) -> list[list[_Link]]:
        t, n = self.topo, len(self.gpus)
        links: list[list[_Link]] = [[] for _ in range(n)]
        if t.nvlink.fabric == "nvswitch":
            per_gpu = t.nvlink.links_per_gpu
            count = t.nvlink.switches or 1
            reach = min(count, per_gpu)          # switches one GPU's links reach
            boards = max(1, count // reach)      # DGX-2: two baseboards of 6 switches
            switch_bdf = [f"0000:{0xc0 + k:02x}:00.0" for k in range(count)]
            for g in range(n):
                board = g * boards // n
                links[g] = [_Link(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                                  switch_bdf[board * reach + link % reach])
                            for link in range(per_gpu)]
        elif t.nvlink.fabric == "direct":
            for g in self.gpus:
                for peer, count in sorted(g.nvlink_peers.items()):
                    links[g.index] += [_Link(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
                                             self._bdf[peer])] * count
        return links

    def _link(self, name: str, handle, link: int) -> _Link:
        i = self._gpu(name, handle)
        if not self._links[i]:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= link < len(self._links[i]):
            raise pynvml.NVMLError_InvalidArgument()
        return self._links[i][link]

    @staticmethod
    def _words(ids, size: int):
        arr = (ctypes.c_ulonglong * size)()
        for x in ids:
            if x < size * 64:        # NVML fills what the caller's array holds
                arr[x // 64] |= 1 << (x % 64)
        return arr

    @staticmethod
    def _pci_info(bdf: str):
        info = pynvml.nvmlPciInfo_t()
        domain, bus, devfn = bdf.split(":")
        info.busId = nvml_bus_id(bdf)
        info.busIdLegacy = nvml_bus_id(bdf)[4:]
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(
            devfn.split(".")[0], 16)
        info.pciDeviceId = 0x20B010DE
        return info

    # -- library ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if "nvmlInit" in self.missing:
            raise pynvml.NVMLError_LibraryNotFound()
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        if not self.initialized:
            raise pynvml.NVMLError_Uninitialized()
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.c_nvmlDevice_t(self._structs[index])

    def nvmlDeviceGetIndex(self, handle) -> int:
        return self._gpu("nvmlDeviceGetIndex", handle)

    # -- identity -----------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle) -> str:
        return self.gpus[self._gpu("nvmlDeviceGetName", handle)].name

    def nvmlDeviceGetUUID(self, handle) -> str:
        mig = self._mig_device(handle)
        if mig is not None:
            self._call("nvmlDeviceGetUUID")
            return mig.uuid
        return fake_uuid(self.topo.model, self._gpu("nvmlDeviceGetUUID", handle))

    def nvmlDeviceGetPciInfo(self, handle):
        return self._pci_info(self._bdf[self._gpu("nvmlDeviceGetPciInfo", handle)])

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        i = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        mem = pynvml.c_nvmlMemory_t()
        mem.total = self.gpus[i].memory_mb * MiB
        mem.used = self.state[i].memory_used
        mem.free = mem.total - mem.used
        return mem

    # -- affinity and topology -----------------------------------------------------------
    def _socket_nodes(self, i: int) -> list:
        nodes = {n.id: n for n in self.topo.host.numa_nodes}
        socket = nodes[self.gpus[i].numa_node].socket
        return [n for n in self.topo.host.numa_nodes if n.socket == socket]

    def nvmlDeviceGetCpuAffinity(self, handle, cpuSetSize: int):
        i = self._gpu("nvmlDeviceGetCpuAffinity", handle)
        return self._words(self.gpus[i].cpu_affinity, cpuSetSize)

    def nvmlDeviceGetCpuAffinityWithinScope(self, handle, cpuSetSize: int, scope: int):
        i = self._gpu("nvmlDeviceGetCpuAffinityWithinScope", handle)
        if scope == pynvml.NVML_AFFINITY_SCOPE_NODE:
            return self._words(self.gpus[i].cpu_affinity, cpuSetSize)
        if scope == pynvml.NVML_AFFINITY_SCOPE_SOCKET:
            return self._words([c for n in self._socket_nodes(i) for c in n.cpus], cpuSetSize)
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetMemoryAffinity(self, handle, nodeSetSize: int, scope: int):
        i = self._gpu("nvmlDeviceGetMemoryAffinity", handle)
        if scope == pynvml.NVML_AFFINITY_SCOPE_NODE:
            return self._words([self.gpus[i].numa_node], nodeSetSize)
        if scope == pynvml.NVML_AFFINITY_SCOPE_SOCKET:
            return self._words([n.id for n in self._socket_nodes(i)], nodeSetSize)
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetNumaNodeId(self, handle) -> int:
        self._gpu("nvmlDeviceGetNumaNodeId", handle)
        raise pynvml.NVMLError_NotSupported()      # x86 DGX: NVML does not say

    def nvmlDeviceGetTopologyCommonAncestor(self, device1, device2) -> int:
        a = self._gpu("nvmlDeviceGetTopologyCommonAncestor", device1)
        b = self._gpu("nvmlDeviceGetTopologyCommonAncestor", device2)
        return self.pci.common_ancestor(f"GPU{a}", f"GPU{b}")

    # -- NVLink -------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, device, link: int) -> int:
        self._link("nvmlDeviceGetNvLinkState", device, link)
        i = self._gpu("nvmlDeviceGetNvLinkState", device)
        return (pynvml.NVML_FEATURE_DISABLED if link in self.state[i].links_down
                else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkVersion(self, device, link: int) -> int:
        self._link("nvmlDeviceGetNvLinkVersion", device, link)
        return NVLINK_VERSION.get(self.topo.nvlink.generation or 0,
                                  pynvml.NVML_NVLINK_VERSION_INVALID)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link).kind

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device, link: int):
        remote = self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        return self._pci_info(remote.remote_bdf)

    def nvmlDeviceGetNvLinkErrorCounter(self, device, link: int, counter: int) -> int:
        self._link("nvmlDeviceGetNvLinkErrorCounter", device, link)
        if counter not in NVLINK_ERROR_COUNTERS:
            raise pynvml.NVMLError_InvalidArgument()
        s = self.state[self._gpu("nvmlDeviceGetNvLinkErrorCounter", device)]
        return s.nvlink_errors.get((link, counter), 0)

    # -- events -------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        self._call("nvmlEventSetCreate")
        struct = pynvml.struct_c_nvmlEventSet_t()
        with self._cond:
            self._sets[ctypes.addressof(struct)] = (struct, _EventSet())
        return pynvml.c_nvmlEventSet_t(struct)

    def _set(self, name: str, event_set) -> _EventSet:
        self._call(name)
        try:
            return self._sets[ctypes.addressof(event_set.contents)][1]
        except (KeyError, ValueError, AttributeError):
            raise pynvml.NVMLError_InvalidArgument() from None

    def nvmlDeviceGetSupportedEventTypes(self, handle) -> int:
        self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
        return SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle, eventTypes: int, eventSet) -> None:
        i = self._gpu("nvmlDeviceRegisterEvents", handle)
        es = self._set("nvmlDeviceRegisterEvents", eventSet)
        if eventTypes & ~SUPPORTED_EVENTS:
            raise pynvml.NVMLError_NotSupported()
        with self._cond:
            es.wanted[i] = es.wanted.get(i, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet, timeoutms: int):
        es = self._set("nvmlEventSetWait", eventSet)
        with self._cond:
            if not es.queue:
                self._cond.wait_for(lambda: es.queue, timeout=timeoutms / 1000)
            if not es.queue:
                raise pynvml.NVMLError_Timeout()
            index, kind, value = es.queue.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.device = pynvml.c_nvmlDevice_t(self._structs[index])
        data.eventType, data.eventData = kind, value
        data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
        return data

    def nvmlEventSetFree(self, eventSet) -> None:
        self._set("nvmlEventSetFree", eventSet)
        with self._cond:
            del self._sets[ctypes.addressof(eventSet.contents)]

    # -- health counters ----------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(self, handle, errorType: int, counterType: int) -> int:
        s = self.state[self._gpu("nvmlDeviceGetTotalEccErrors", handle)]
        if counterType not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise pynvml.NVMLError_InvalidArgument()
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return s.ecc_corrected        # the fake keeps no corrected errors from before
        if errorType != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            raise pynvml.NVMLError_InvalidArgument()
        return s.ecc_volatile if counterType == pynvml.NVML_VOLATILE_ECC else s.ecc_aggregate

    def nvmlDeviceGetRemappedRows(self, device):
        s = self.state[self._gpu("nvmlDeviceGetRemappedRows", device)]
        if self.volta:
            raise pynvml.NVMLError_NotSupported()
        return (0, int(s.remap_pending or s.remap_failed), int(s.remap_pending),
                int(s.remap_failed))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device) -> int:
        s = self.state[self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", device)]
        if not self.volta:
            raise pynvml.NVMLError_NotSupported()
        return pynvml.NVML_FEATURE_ENABLED if s.retired_pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:
        s = self.state[self._gpu("nvmlDeviceGetTemperature", handle)]
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return s.temperature

    def nvmlDeviceGetTemperatureThreshold(self, handle, threshold: int) -> int:
        self._gpu("nvmlDeviceGetTemperatureThreshold", handle)
        if threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            return 87
        raise pynvml.NVMLError_NotSupported()

    # -- utilization --------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle):
        s = self.state[self._gpu("nvmlDeviceGetUtilizationRates", handle)]
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = s.util_gpu, s.util_memory
        return util

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        return self.state[self._gpu("nvmlDeviceGetPowerUsage", handle)].power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        # Volta and newer (every model here) count energy
        return self.state[self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle)].energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle) -> int:
        i = self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self.state[i].clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle) -> int:   # before driver 535
        return self.state[self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons",
                                    handle)].clock_reasons
