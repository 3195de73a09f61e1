"""The current DGX host models (DGX A100 640GB, DGX B200, GB200 NVL72 compute tray): what
their sources publish, as loaded by the engine and printed by `airflow-gpu topo`."""

import subprocess
import sys

import pytest

from airflow_gpu.scheduler_core.engine.hosttype import GiB, bits, host_type
from airflow_gpu.scheduler_core.engine.topology import Topology, load_topology
from tests.helpers import REPO

NEW = ["dgx-a100-80gb", "dgx-b200", "gb200-nvl72-tray"]
HOSTMODELS = REPO / "src/airflow_gpu/scheduler_core/engine/hostmodels"


def topo(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "topo", *args],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("name", NEW)
def test_each_names_its_sources_and_loads_consistently(name):
    head = (HOSTMODELS / f"{name}.yaml").read_text().split("schema:")[0]
    assert "# Sources:" in head and "'# assumed'" in head
    t = load_topology(name)
    ht = host_type(t)
    numa = {n.id: n for n in t.host.numa_nodes}
    assert sum(len(n.cpus) for n in numa.values()) == t.host.total_threads
    assert sum(n.memory_gb for n in numa.values()) == t.host.memory_gb
    for g in t.gpus:
        assert g.cpu_affinity == numa[g.numa_node].cpus
        row = t.topo_matrix.rows[f"GPU{g.index}"]
        for peer, links in g.nvlink_peers.items():
            assert row[t.topo_matrix.columns.index(f"GPU{peer}")] == f"NV{links}"
    assert bits(ht.tree.mask) == list(range(len(t.gpus)))
    # the document form (what agents send) reads back as the same model
    assert Topology.model_validate(t.document()) == t


def test_dgx_a100_640gb():
    t = load_topology("dgx-a100-80gb")
    ht = host_type(t)
    assert ht.n_gpus == 8 and set(ht.gpu_name) == {"NVIDIA A100-SXM4-80GB"}
    assert ht.gpu_mem[0] == 81920 * 2**20
    assert t.host.memory_gb == 2048 and len(ht.numa_ids) == 8
    # the 320GB system's board: same NUMA layout, GPU pairs and HCAs
    old = load_topology("dgx-a100")
    assert [(g.numa_node, g.pcie_switch) for g in t.gpus] == [
        (g.numa_node, g.pcie_switch) for g in old.gpus]
    # two GPUs and two HCAs per switch: each GPU its own
    assert ht.gpu_nics[0] == ["mlx5_0"] and ht.gpu_nics[7] == ["mlx5_9"]
    assert t.nvlink.switches == 6 and t.nvlink.links_per_gpu == 12


def test_dgx_b200():
    t = load_topology("dgx-b200")
    ht = host_type(t)
    assert ht.n_gpus == 8 and set(ht.gpu_name) == {"NVIDIA B200"}
    assert ht.gpu_mem[0] // GiB == 180
    assert t.host.cpu_model == "Intel Xeon Platinum 8570"
    assert (t.host.sockets, t.host.cores_per_socket, t.host.total_threads) == (2, 56, 224)
    assert t.host.memory_gb == 2048
    assert [(n.id, n.socket) for n in t.host.numa_nodes] == [(0, 0), (1, 1)]
    assert t.host.numa_nodes[0].cpus == [*range(0, 56), *range(112, 168)]
    assert t.host.numa_nodes[1].cpus == [*range(56, 112), *range(168, 224)]
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    # NVLink 5 through 2 NVSwitch chips: NV18 between every pair
    assert (t.nvlink.fabric, t.nvlink.switches, t.nvlink.generation) == ("nvswitch", 2, 5)
    assert all(ht.links[a][b] == 18 for a in range(8) for b in range(8) if a != b)
    assert t.nvlink.domain_gpus is None
    # each GPU has its own 400G ConnectX-7 behind its PCIe switch; BlueField-3 for storage
    assert [ht.gpu_nics[g] for g in range(8)] == [[f"mlx5_{g}"] for g in range(8)]
    compute = [n for n in t.nics if n.role == "compute"]
    assert len(compute) == 8 and {n.port_speed_gbps for n in compute} == {400}
    storage = [n.name for n in t.nics if n.role == "storage_inband"]
    assert storage == ["mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"]


def test_gb200_nvl72_tray():
    t = load_topology("gb200-nvl72-tray")
    ht = host_type(t)
    assert ht.n_gpus == 4 and set(ht.gpu_name) == {"NVIDIA GB200"}
    # two Grace CPUs: one NUMA node each, 72 cores (one thread each) and 480 GB LPDDR5X
    assert (t.host.sockets, t.host.total_cores, t.host.threads_per_core) == (2, 144, 1)
    assert [(n.id, n.cpus, n.memory_gb) for n in t.host.numa_nodes] == [
        (0, list(range(72)), 480), (1, list(range(72, 144)), 480)]
    assert [n.bit_count() for n in ht.numa_cpus] == [72, 72]
    # each Grace with its two GPUs (NVLink-C2C); GPU memory is a NUMA node of its own
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]
    assert [g.gpu_numa_id for g in t.gpus] == [2, 10, 18, 26]
    assert ht.total_mem == 960 * GiB        # GPU memory nodes are never host memory
    # NVLink leaves the tray: NV18 to the rack's NVLink switches, one 72-GPU domain
    assert (t.nvlink.generation, t.nvlink.links_per_gpu, t.nvlink.domain_gpus) == (5, 18, 72)
    assert all(ht.links[a][b] == 18 for a in range(4) for b in range(4) if a != b)
    # the compute NICs of a GPU are its Grace's
    assert ht.gpu_nics == [["mlx5_0", "mlx5_1"]] * 2 + [["mlx5_4", "mlx5_5"]] * 2


def test_a_domain_smaller_than_the_host_is_refused():
    doc = load_topology("gb200-nvl72-tray").document()
    doc["nvlink"]["domain_gpus"] = 2
    with pytest.raises(ValueError, match="nvlink.domain_gpus: 2 is fewer than the host's own 4"):
        Topology.model_validate(doc)


def test_topo_prints_the_published_matrices():
    b200 = topo("--model", "dgx-b200").splitlines()
    assert b200[0].startswith("dgx-b200: 8x NVIDIA B200")
    gpu0 = b200[3].split()
    assert gpu0[:9] == ["GPU0", "X", *["NV18"] * 7]
    assert gpu0[9:21] == ["PXB", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS",
                          "NODE", "NODE", "SYS", "SYS"]
    assert gpu0[21:] == ["0-55,112-167", "0"]
    assert b200[10].split()[-2:] == ["56-111,168-223", "1"]

    tray = topo("--model", "gb200-nvl72-tray")
    lines = tray.splitlines()
    assert "GPU NUMA ID" in lines[2]
    assert lines[3].split() == ["GPU0", "X", "NV18", "NV18", "NV18", "0-71", "0", "2"]
    assert lines[6].split() == ["GPU3", "NV18", "NV18", "NV18", "X", "72-143", "1", "26"]
    assert "72-GPU NVLink domain beyond this host" in tray

    a100 = topo("--model", "dgx-a100-80gb")
    assert a100.startswith("dgx-a100-80gb: 640GB (8x A100-SXM4-80GB)")
    assert "48-63,176-191   3" in a100
    assert "GPU NUMA ID" not in a100


def test_models_lists_them():
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "models"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    for name in NEW:
        assert name in out.stdout
