"""Utilization samples sent with each heartbeat: GPU and memory utilization (percent over
NVML's last sample period), memory used, power draw and temperature; and the slow signals
the service watches for wear: the energy counter, corrected ECC errors, NVLink errors and
thermal throttling."""

from __future__ import annotations

from .health import thermal_throttle
from .nvmlcalls import optional

NVLINK_ERROR_COUNTERS = ("NVML_NVLINK_ERROR_DL_REPLAY", "NVML_NVLINK_ERROR_DL_RECOVERY",
                         "NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA")


def sample(nvml, h) -> dict:
    """One GPU's values; a value this GPU does not report is None."""
    try:
        util = optional(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        mem = optional(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
        power = optional(nvml, nvml.nvmlDeviceGetPowerUsage, h)     # milliwatts
        temp = optional(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        energy = optional(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption, h)   # mJ
        sbe = optional(nvml, nvml.nvmlDeviceGetTotalEccErrors, h,
                       nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)
        reasons = _clock_event_reasons(nvml, h)
        nvlink = nvlink_errors(nvml, h)
    except nvml.NVMLError:        # a lost GPU: health reports it, there is nothing to sample
        return {}
    return {
        "utilization_gpu": float(util.gpu) if util is not None else None,
        "utilization_memory": float(util.memory) if util is not None else None,
        "memory_used_bytes": int(mem.used) if mem is not None else None,
        "power_watts": power / 1000 if power is not None else None,
        "temperature_c": float(temp) if temp is not None else None,
        "energy_joules": energy / 1000 if energy is not None else None,
        "ecc_corrected_total": int(sbe) if sbe is not None else None,
        "nvlink_errors_total": nvlink,
        "thermal_throttle": thermal_throttle(reasons),
    }


def _clock_event_reasons(nvml, h) -> int | None:
    """The clock event reasons bitmask; drivers before 535 only know the throttle name."""
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    reasons = optional(nvml, fn, h) if fn is not None else None
    if reasons is None:
        reasons = optional(nvml, nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    return reasons


def nvlink_errors(nvml, h) -> int | None:
    """CRC flit + CRC data + replay + recovery errors over the GPU's active links; None
    where the GPU has no NVLink or NVML does not count them."""
    counters = [getattr(nvml, name) for name in NVLINK_ERROR_COUNTERS]
    total, counted = 0, False
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        state = optional(nvml, nvml.nvmlDeviceGetNvLinkState, h, link)
        if state != nvml.NVML_FEATURE_ENABLED:
            continue
        for counter in counters:
            n = optional(nvml, nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if n is not None:
                total, counted = total + int(n), True
    return total if counted else None
