"""Declared mode: a host without NVML (or a simulated one) reports a built-in model, or a
gpu-topology/v1 file, as if it had been discovered; its GPUs are always healthy and report
no utilization."""

from __future__ import annotations

import time

from ..scheduler_core.engine.topology import Topology, load_topology
from ..scheduler_core.errors import InputError


class DeclaredSource:
    def __init__(self, model: str):
        try:
            self.topology: Topology = load_topology(model)
        except InputError as exc:
            raise InputError(f"--declared: {exc}") from None

    def wait(self, seconds: float) -> bool:
        time.sleep(max(0.0, seconds))
        return False

    def gpus(self) -> list[dict]:
        return [{"index": g.index, "healthy": True} for g in self.topology.gpus]

    def close(self) -> None:
        pass
