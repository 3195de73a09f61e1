"""Fake hosts for the agent tests: a fake NVML and a fake /sys built from one of the
built-in DGX models; the service tests' databases (SQLite and PostgreSQL)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_gpu.scheduler_core.engine.topology import Topology, load_topology
from tests.agent.fakenvml import FakeNVML
from tests.agent.fakesysfs import write_host

# Every built-in model but the GB200 tray: its GPUs hang off the Grace CPUs by NVLink-C2C,
# not a PCIe switch, so discovery's rule for compute NICs (a GPU on the NIC's switch) does
# not hold there (docs/host-models.md: run the agent with --declared gb200-nvl72-tray).
MODELS = ("dgx-1v", "dgx-2", "dgx-a100", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200")


@dataclass
class FakeHost:
    topo: Topology
    nvml: FakeNVML
    sysfs: Path
    procfs: Path


@pytest.fixture
def fake_host(tmp_path):
    """fake_host("dgx-a100", missing=(...)) -> a FakeHost; NVML not yet initialised."""
    made = 0

    def make(model: str, missing: tuple = ()) -> FakeHost:
        nonlocal made
        made += 1
        topo = load_topology(model)
        nvml = FakeNVML(topo, missing=missing)
        sysfs, procfs = write_host(topo, nvml.pci, tmp_path / f"host{made}")
        return FakeHost(topo, nvml, sysfs, procfs)

    return make
