"""The host as NVML and sysfs show it: its model (discovered once, at start), then its
GPUs' health and utilization whenever the agent asks."""

from __future__ import annotations

from pathlib import Path

from ..scheduler_core.errors import InputError
from .discover import discover
from .health import HealthMonitor
from .utilization import sample


def nvml_init(nvml) -> None:
    """nvmlInit, or a clear error on a host without the NVIDIA driver."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise InputError(f"NVML cannot start on this host ({exc}): install the NVIDIA "
                         "driver, or run the agent with --declared MODEL") from None


def load_nvml():
    """The real NVML binding (nvidia-ml-py); imported only when an agent starts."""
    try:
        import pynvml
    except ImportError:
        raise InputError("the pynvml module is missing: pip install nvidia-ml-py") from None
    return pynvml


class NvmlSource:
    def __init__(self, nvml, sysfs: Path = Path("/sys"), procfs: Path = Path("/proc"),
                 hostname: str | None = None, max_temperature: float | None = None):
        self.nvml = nvml
        nvml_init(nvml)
        try:
            self.topology = discover(nvml, sysfs, procfs, hostname)
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(g.index)
                            for g in self.topology.gpus]
            self.monitor = HealthMonitor(nvml, self.handles, max_temperature)
        except BaseException:
            nvml.nvmlShutdown()
            raise

    def wait(self, seconds: float) -> bool:
        """Block up to `seconds`; True as soon as a GPU turned unhealthy."""
        return self.monitor.wait(seconds)

    def gpus(self) -> list[dict]:
        """Each GPU's health and utilization, as the report route takes them."""
        out = []
        for state, h, g in zip(self.monitor.check(), self.handles, self.topology.gpus,
                               strict=True):
            out.append({"index": state.index, "healthy": state.healthy,
                        "reason": state.reason, "uuid": g.uuid, **sample(self.nvml, h)})
        return out

    def close(self) -> None:
        self.monitor.close()
        self.nvml.nvmlShutdown()
