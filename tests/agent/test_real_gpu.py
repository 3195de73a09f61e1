"""The same discovery, health checks and sampling against the real NVML (nvidia-ml-py) and
the real /sys, on a host with an NVIDIA GPU. Skipped, with the reason, elsewhere."""

from __future__ import annotations

import pytest

from airflow_gpu.agent.source import NvmlSource
from airflow_gpu.agent.topoprint import topo_text
from airflow_gpu.scheduler_core.engine.hosttype import host_type

pytestmark = pytest.mark.gpu
PCIE = {"PIX", "PXB", "PHB", "NODE", "SYS"}


@pytest.fixture(scope="module")
def nvml():
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVIDIA GPU here: pynvml cannot initialise ({exc})")
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    if not count:
        pytest.skip("NVML started but reports no GPU")
    return pynvml


@pytest.fixture
def source(nvml):
    src = NvmlSource(nvml)
    yield src
    src.close()


def test_discovery_on_this_host(nvml, source):
    t = source.topology
    assert len(t.gpus) == nvml.nvmlDeviceGetCount()
    for g, h in zip(t.gpus, source.handles, strict=True):
        assert g.name == nvml.nvmlDeviceGetName(h)
        assert g.memory_mb == nvml.nvmlDeviceGetMemoryInfo(h).total // 2**20
        assert g.pci_bus_id and g.uuid.startswith(("GPU-", "MIG-"))
        assert g.cpu_affinity and g.numa_node in {n.id for n in t.host.numa_nodes}
        assert set(g.cpu_affinity) <= {c for n in t.host.numa_nodes for c in n.cpus}
    htype = host_type(t)                   # the engine takes it like a built-in model
    assert htype.n_gpus == len(t.gpus)
    rows = t.topo_matrix.rows
    for i in range(len(t.gpus)):
        for j, cell in enumerate(rows[f"GPU{i}"]):
            links = t.gpus[i].nvlink_peers.get(j, 0) if j < len(t.gpus) else 0
            want = {"X"} if i == j else {f"NV{links}"} if links else PCIE
            assert cell in want, (i, t.topo_matrix.columns[j], cell)
    print(topo_text(t))                    # what the real host looks like, for the log


def test_health_and_utilization_on_this_host(source):
    gpus = source.gpus()
    assert [g["index"] for g in gpus] == [g.index for g in source.topology.gpus]
    for g in gpus:
        assert isinstance(g["healthy"], bool)
        assert g["healthy"] or g["reason"]
        assert g.get("memory_used_bytes") is None or g["memory_used_bytes"] >= 0
    assert source.wait(0.1) in (True, False)     # the event set answers (or times out)
    print(gpus)
