"""Utilization samples sent with each heartbeat: GPU and memory utilization (percent over
NVML's last sample period), memory used, power draw and temperature."""

from __future__ import annotations

from .nvmlcalls import optional


def sample(nvml, h) -> dict:
    """One GPU's values; a value this GPU does not report is None."""
    try:
        util = optional(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        mem = optional(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
        power = optional(nvml, nvml.nvmlDeviceGetPowerUsage, h)     # milliwatts
        temp = optional(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    except nvml.NVMLError:        # a lost GPU: health reports it, there is nothing to sample
        return {}
    return {
        "utilization_gpu": float(util.gpu) if util is not None else None,
        "utilization_memory": float(util.memory) if util is not None else None,
        "memory_used_bytes": int(mem.used) if mem is not None else None,
        "power_watts": power / 1000 if power is not None else None,
        "temperature_c": float(temp) if temp is not None else None,
    }
