"""The agent's settings: flags, or a YAML file (`--config`) for what stays the same on a
host. Flags win over the file."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..scheduler_core.errors import load_yaml, validate

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str | None = Field(None, description="the scheduler-core service URL")
    token: str | None = Field(None, description="the host's agent token (airflow-gpu "
                              "token create --agent --host NAME), or an admin token")
    name: str | None = Field(None, max_length=200, pattern=NAME,
                             description="host name in the cluster (default: "
                             "$AIRFLOW_GPU_LOCAL_HOST, else the short hostname)")
    rack: str | None = Field(None, max_length=200)
    switch: str | None = Field(None, max_length=200, description="leaf / top-of-rack switch")
    docker_url: str | None = None
    address: str | None = Field(None, description="address other hosts reach this one at")
    labels: dict[str, str] = {}
    interval: float = Field(10.0, gt=0, le=3600, description="seconds between heartbeats")
    declared: str | None = Field(None, description="report this built-in model (or "
                                 "gpu-topology/v1 file) instead of discovering with NVML")
    max_temperature: float | None = Field(None, gt=0, le=200, description="GPU temperature "
                                          "(C) over which a GPU is unhealthy; default: the "
                                          "GPU's slowdown temperature")
    telemetry: Literal["nvml", "dcgm", "auto"] = Field(
        "auto", description="where GPU health and utilization come from: nvml; dcgm (the "
        "dcgm-exporter at dcgm_exporter, else DCGM's Python bindings); auto: DCGM when it "
        "is there, else NVML")
    dcgm_exporter: str | None = Field(None, max_length=2000, description="the host's "
                                      "dcgm-exporter (http://localhost:9400/metrics) to read "
                                      "GPU health and utilization from")


def load_config(path: str) -> AgentConfig:
    return validate(AgentConfig, load_yaml(path) or {}, path)
