"""Which source the agent reads: the host's model comes from NVML discovery (or
--declared), GPU health and utilization from DCGM when it is there, else NVML.

`telemetry` (--telemetry) picks:
- nvml: NVML for both (NvmlSource), as before DCGM was supported;
- dcgm: the dcgm-exporter at `dcgm_exporter` if given, else DCGM's Python bindings and
  its host engine; an error names the fix when neither is there;
- auto (default): the exporter if `dcgm_exporter` is given, else DCGM's bindings if they
  import and a host engine answers, else NVML. A --declared host without an exporter
  reports no telemetry (its GPUs are always healthy), as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..scheduler_core.engine.topology import Topology
from ..scheduler_core.errors import InputError
from .config import AgentConfig
from .discover import discover

log = logging.getLogger(__name__)


class Composed:
    """A host's model from one place, its GPUs' health and utilization from another."""

    def __init__(self, topology: Topology, telemetry, what: str):
        self.topology = topology
        self.telemetry = telemetry
        self.what = what
        log.info("GPU health and utilization from %s", what)

    def gpus(self) -> list[dict]:
        return self.telemetry.gpus()

    def wait(self, seconds: float) -> bool:
        return self.telemetry.wait(seconds)

    def close(self) -> None:
        self.telemetry.close()


def discover_host(nvml, sysfs: Path, procfs: Path, name: str | None) -> Topology:
    """The host's model by NVML discovery; NVML is shut down again (DCGM reads the GPUs)."""
    from .source import nvml_init

    nvml_init(nvml)
    try:
        return discover(nvml, sysfs, procfs, name)
    finally:
        nvml.nvmlShutdown()


def make_source(config: AgentConfig, sysfs: Path = Path("/sys"),
                procfs: Path = Path("/proc"), nvml=None, dcgm: Callable | None = None):
    """The agent's source for `config`. `nvml`: the NVML module (default pynvml); `dcgm`:
    a function returning the DCGM interface (default: PyDcgm on the local host engine)."""
    from .declared import DeclaredSource
    from .source import NvmlSource, load_nvml

    mode, url = config.telemetry, config.dcgm_exporter
    if mode == "nvml" and url:
        raise InputError(f"dcgm_exporter: {url!r} is read with telemetry dcgm or auto, not "
                         "nvml; drop --dcgm-exporter or use --telemetry auto")
    if config.declared:
        if mode == "nvml":
            raise InputError("telemetry: nvml needs NVML discovery, which --declared skips; "
                             "leave telemetry at auto (a declared host reports no telemetry) "
                             "or give --dcgm-exporter URL")
        declared = DeclaredSource(config.declared)
        if url:
            return _exporter(config, declared.topology)
        if mode == "dcgm":
            return _bindings(config, declared.topology, dcgm, required=True)
        return declared
    nvml = nvml or load_nvml()
    if mode == "nvml":
        return NvmlSource(nvml, sysfs, procfs, config.name, config.max_temperature)
    if url:
        return _exporter(config, discover_host(nvml, sysfs, procfs, config.name))
    api = _connect(dcgm, required=mode == "dcgm")
    if api is None:
        return NvmlSource(nvml, sysfs, procfs, config.name, config.max_temperature)
    try:
        topology = discover_host(nvml, sysfs, procfs, config.name)
    except BaseException:
        api.close()
        raise
    return _bindings(config, topology, lambda: api, required=True)


def _exporter(config: AgentConfig, topology: Topology) -> Composed:
    from .dcgm_exporter import ExporterTelemetry

    telemetry = ExporterTelemetry(config.dcgm_exporter, topology, config.max_temperature)
    return Composed(topology, telemetry, f"dcgm-exporter at {telemetry.url}")


def _connect(dcgm: Callable | None, required: bool):
    """The DCGM interface, or None (auto: NVML then) where DCGM is not there."""
    from .dcgm_bindings import DcgmError, PyDcgm, missing_bindings

    try:
        return (dcgm or PyDcgm)()
    except DcgmError as exc:
        if required:
            raise missing_bindings(str(exc)) from None
        log.info("DCGM is not there (%s); GPU health and utilization from NVML", exc)
        return None


def _bindings(config: AgentConfig, topology: Topology, dcgm: Callable | None,
              required: bool) -> Composed:
    from .dcgm_bindings import DcgmError, DcgmTelemetry, missing_bindings

    api = _connect(dcgm, required)
    try:
        telemetry = DcgmTelemetry(api, topology, config.max_temperature)
    except DcgmError as exc:
        api.close()
        raise missing_bindings(str(exc)) from None
    except BaseException:
        api.close()
        raise
    return Composed(topology, telemetry, "DCGM's host engine")
