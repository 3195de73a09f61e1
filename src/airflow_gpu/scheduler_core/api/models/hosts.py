"""The bodies of the host routes: drain, registration and reports of node agents."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ...engine.topology import Topology
from .base import RequestBody


class HostOut(BaseModel):
    name: str
    drained: bool
    drain_reason: str | None = None


class DrainRequest(RequestBody):
    reason: str | None = Field(None, min_length=1, max_length=1000,
                               pattern=r"^[^\x00-\x1f\x7f]+$",
                               description="why (shown in the cluster view and in pending "
                               "reasons that name the host)")


class GpuHealth(RequestBody):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    index: int = Field(ge=0, le=63)
    healthy: bool
    reason: str | None = Field(None, max_length=1000)
    # the node agent's latest utilization sample (omitted: left as it was)
    utilization_gpu: float | None = Field(None, ge=0, le=100, description="percent")
    utilization_memory: float | None = Field(None, ge=0, le=100, description="percent")
    memory_used_bytes: int | None = Field(None, ge=0, le=2**53)
    power_watts: float | None = Field(None, ge=0, le=1e6)
    temperature_c: float | None = Field(None, ge=-273, le=1000)
    # from DCGM or NVML beyond hard faults (see docs/agent.md); omitted: unknown
    uuid: str | None = Field(None, max_length=100, pattern=r"^[A-Za-z0-9_.:/-]+$")
    energy_joules: float | None = Field(None, ge=0, le=1e18, description="energy counter "
                                        "since the driver loaded")
    sm_active: float | None = Field(None, ge=0, le=100, description="percent")
    ecc_corrected_total: int | None = Field(None, ge=0, le=2**62)
    nvlink_errors_total: int | None = Field(None, ge=0, le=2**62)
    thermal_throttle: bool | None = None


class HostReport(RequestBody):
    gpus: list[GpuHealth] = Field(max_length=64)


class GpuOut(BaseModel):
    index: int
    name: str
    healthy: bool
    health_reason: str | None


_TEXT = r"^[^\x00-\x1f\x7f]+$"


class HostRegistration(RequestBody):
    """What a node agent sends when it starts: its host's model and, for a host the
    cluster file does not list, where the host sits."""

    topology: Topology = Field(description="the host's gpu-topology/v1 model, discovered "
                               "with NVML or declared")
    rack: str | None = Field(None, min_length=1, max_length=200, pattern=_TEXT)
    switch: str | None = Field(None, min_length=1, max_length=200, pattern=_TEXT,
                               description="leaf / top-of-rack switch")
    docker_url: str | None = Field(None, min_length=1, max_length=1000, pattern=_TEXT)
    address: str | None = Field(None, min_length=1, max_length=1000, pattern=_TEXT)
    labels: dict[str, str] = Field(default_factory=dict, max_length=100)
