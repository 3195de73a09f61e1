"""GPU health: each GPU is healthy or not, with a reason a person can act on.

Rules (a GPU is unhealthy while any holds):
- an XID event other than an application error (13, 31, 43, 45, 68, 109: the program
  failed, the GPU did not); XIDs are events, so the fault stays until the agent restarts
  (after the GPU is reset or the host rebooted);
- a double-bit ECC error event, or uncorrected ECC errors counted since the driver loaded;
- a failed row remapping, or a remap pending until the GPU is reset (Ampere and newer);
- pages pending retirement until the GPU is reset (Volta and older);
- the GPU temperature over a threshold (the GPU's slowdown temperature, else 90 C);
- NVML answering "GPU is lost" (it fell off the bus).

The DCGM telemetry (dcgm_exporter.py, dcgm_bindings.py) applies the same rules to DCGM's
fields through `xid_fault` and `counter_reasons`, so both sources give the same reasons.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .nvmlcalls import optional

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
XID_NAMES = {
    13: "graphics engine exception", 31: "GPU memory page fault",
    43: "GPU stopped processing", 45: "preemptive cleanup", 48: "double-bit ECC error",
    61: "internal micro-controller breakpoint", 62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapper recording failure", 68: "video decoder exception",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 109: "context switch timeout",
    119: "GSP RPC timeout", 120: "GSP error",
}
DEFAULT_MAX_TEMPERATURE = 90.0
# clock event (throttle) reasons that mean heat: HW slowdown 0x8, SW thermal 0x20, HW
# thermal 0x40; NVML's nvmlClocksEventReason* and DCGM's DCGM_CLOCKS_EVENT_REASON_* agree
THERMAL_THROTTLE_BITS = 0x8 | 0x20 | 0x40


@dataclass
class GpuHealth:
    index: int
    healthy: bool = True
    reason: str | None = None


def xid_reason(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"XID {xid}" + (f" ({name})" if name else "")


def xid_fault(index: int, xid: int) -> str | None:
    """The reason an XID makes a GPU unhealthy; None for an application error (logged)."""
    if xid in APPLICATION_XIDS:
        log.info("GPU %d: %s, an application error; the GPU stays healthy",
                 index, xid_reason(xid))
        return None
    return xid_reason(xid)


def counter_reasons(dbe: int | None = None, remap_pending: bool = False,
                    remap_failed: bool = False, retired_pending: bool = False,
                    temperature: float | None = None,
                    limit: float = DEFAULT_MAX_TEMPERATURE) -> list[str]:
    """Reasons from the counters a GPU reports now (NVML or DCGM), in one wording."""
    out = []
    if dbe:
        out.append(f"{dbe} uncorrected ECC errors since the driver loaded")
    if remap_failed:
        out.append("row remapping failed; the GPU needs service")
    elif remap_pending:
        out.append("row remapping pending; reset the GPU")
    if retired_pending:
        out.append("retired pages pending; reset the GPU")
    if temperature is not None and temperature > limit:
        out.append(f"temperature {temperature:g} C is over the limit of {limit:g} C")
    return out


def thermal_throttle(reasons: int | None) -> bool | None:
    """Whether a clock event reasons bitmask says the clocks are slowed for heat."""
    return None if reasons is None else bool(int(reasons) & THERMAL_THROTTLE_BITS)


class HealthMonitor:
    """Watches the GPUs' events and counters. `wait` blocks on the NVML event set (so a
    fault is seen as it happens); `check` reads the counters and returns every GPU's state."""

    def __init__(self, nvml, handles: list, max_temperature: float | None = None):
        self.nvml = nvml
        self.handles = handles
        self.max_temperature = max_temperature
        self.faults: dict[int, str] = {}    # GPU index -> the event that made it unhealthy
        self.events = self._register()

    def _register(self):
        nvml = self.nvml
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("no NVML event set (%s): XIDs are not watched, counters still are", exc)
            return None
        for i, h in enumerate(self.handles):
            supported = optional(nvml, nvml.nvmlDeviceGetSupportedEventTypes, h) or 0
            try:
                if supported & wanted:
                    nvml.nvmlDeviceRegisterEvents(h, supported & wanted, events)
            except nvml.NVMLError as exc:   # e.g. not supported in this container
                log.warning("GPU %d: XID events not watched (%s)", i, exc)
        return events

    def close(self) -> None:
        if self.events is not None:
            optional(self.nvml, self.nvml.nvmlEventSetFree, self.events)
            self.events = None

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for events; True as soon as one made a GPU unhealthy."""
        nvml = self.nvml
        if self.events is None:
            time.sleep(max(0.0, seconds))
            return False
        timeout_ms = max(0, int(seconds * 1000))
        changed = False
        while True:
            try:
                data = nvml.nvmlEventSetWait(self.events, timeout_ms)
            except nvml.NVMLError_Timeout:
                return changed
            except nvml.NVMLError as exc:
                log.warning("waiting for NVML events failed: %s", exc)
                time.sleep(min(1.0, max(0.0, seconds)))
                return changed
            changed |= self._record(data)
            timeout_ms = 0          # drain what is queued, then report at once

    def _record(self, data) -> bool:
        nvml = self.nvml
        try:
            index = nvml.nvmlDeviceGetIndex(data.device)
        except nvml.NVMLError:
            return False
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            reason = xid_fault(index, int(data.eventData))
            if reason is None:
                return False
        elif data.eventType & nvml.nvmlEventTypeDoubleBitEccError:
            reason = "double-bit ECC error"
        else:
            return False
        if index in self.faults:
            return False
        log.warning("GPU %d unhealthy: %s", index, reason)
        self.faults[index] = reason
        return True

    def check(self) -> list[GpuHealth]:
        return [self._check(i, h) for i, h in enumerate(self.handles)]

    def _check(self, i: int, h) -> GpuHealth:
        nvml = self.nvml
        reasons = [self.faults[i]] if i in self.faults else []
        try:
            reasons += self._counters(h)
        except nvml.NVMLError_GpuIsLost:
            reasons.append("GPU is lost (fell off the bus); reset the GPU or reboot the host")
        except nvml.NVMLError as exc:
            reasons.append(f"NVML cannot read the GPU ({exc})")
        return GpuHealth(i, not reasons, "; ".join(reasons) or None)

    def _counters(self, h) -> list[str]:
        nvml = self.nvml
        dbe = optional(nvml, nvml.nvmlDeviceGetTotalEccErrors, h,
                       nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        rows = optional(nvml, nvml.nvmlDeviceGetRemappedRows, h)
        _, _, pending, failed = rows if rows is not None else (0, 0, 0, 0)
        retired = optional(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        temp = optional(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        limit = self.max_temperature
        if limit is None:
            limit = optional(nvml, nvml.nvmlDeviceGetTemperatureThreshold, h,
                             nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) or DEFAULT_MAX_TEMPERATURE
        return counter_reasons(dbe, bool(pending), bool(failed),
                               retired == nvml.NVML_FEATURE_ENABLED, temp, limit)
