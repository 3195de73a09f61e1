
import pytest
import yaml

from airflow_gpu.scheduler_core.engine.hosttype import bits, host_type
from airflow_gpu.scheduler_core.engine.topology import (
    Topology,
    builtin_model_names,
    format_cpulist,
    load_topology,
    parse_cpulist,
)
from airflow_gpu.scheduler_core.errors import InputError
from tests.helpers import REPO

MODELS = ["dgx-1v", "dgx-2", "dgx-a100", "dgx-h100", "dgx-h200"]
HOSTMODELS = REPO / "src/airflow_gpu/scheduler_core/engine/hostmodels"


def test_cpulists():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        parse_cpulist("3-1")


def test_built_in_models():
    # the five of the shared data, and the current DGX models (test_new_hostmodels.py)
    assert builtin_model_names() == sorted(
        MODELS + ["dgx-a100-80gb", "dgx-b200", "gb200-nvl72-tray"])


@pytest.mark.parametrize("name", MODELS)
def test_builtin_models_match_the_reference_data(name):
    """The shipped models are the reference topologies (tests/data/topologies: public
    facts, each file naming its sources)."""
    assert (HOSTMODELS / f"{name}.yaml").read_bytes() == (
        REPO / "tests" / "data" / "topologies" / f"{name}.yaml").read_bytes()


@pytest.mark.parametrize("name", MODELS)
def test_models_are_consistent(name):
    topo = load_topology(name)
    t = host_type(topo)
    numa = {n.id: n for n in topo.host.numa_nodes}
    assert sum(len(n.cpus) for n in numa.values()) == topo.host.total_threads
    for g in topo.gpus:
        # every GPU has a known NUMA node whose cpus are its affinity, and a PCIe switch
        assert g.cpu_affinity == numa[g.numa_node].cpus
        assert g.pcie_switch in {s.id for s in topo.pcie_switches}
        for peer, links in g.nvlink_peers.items():
            assert topo.gpus[peer].nvlink_peers[g.index] == links
        # the topo matrix agrees with the NVLink peers
        row = topo.topo_matrix.rows[f"GPU{g.index}"]
        for peer in range(len(topo.gpus)):
            label = row[topo.topo_matrix.columns.index(f"GPU{peer}")]
            if peer in g.nvlink_peers:
                assert label == f"NV{g.nvlink_peers[peer]}"
    assert t.all_gpus.bit_count() == len(topo.gpus)
    assert bits(t.tree.mask) == list(range(len(topo.gpus)))


def test_dgx1_nvlink_quads():
    t = host_type(load_topology("dgx-1v"))
    for quad in ([0, 1, 2, 3], [4, 5, 6, 7]):
        assert all(t.links[a][b] for a in quad for b in quad if a != b)
    assert t.links[0][5] == 0 and t.links[0][4] == 2 and t.links[0][1] == 1


def test_user_topology_file(tmp_path):
    data = yaml.safe_load((HOSTMODELS / "dgx-h100.yaml").read_text())
    data["model"] = "my-h100"
    path = tmp_path / "my-h100.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_topology(str(path)).model == "my-h100"


def test_asymmetric_nvlink_is_refused(tmp_path):
    data = yaml.safe_load((HOSTMODELS / "dgx-1v.yaml").read_text())
    data["gpus"][0]["nvlink_peers"][1] = 2
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="symmetric"):
        load_topology(str(path))


def test_unknown_model_lists_the_built_ins():
    with pytest.raises(InputError, match="dgx-a100"):
        load_topology("dgx-b300")


@pytest.mark.parametrize("siblings, error", [
    ([""], r"thread_siblings\[0\]: a core has at least one CPU"),
    (["0,9999"], r"thread_siblings\[0\]: cpu 9999 is in no NUMA node"),
    (["0,1", "1,2"], r"cpu 1 is in cores 0 and 1"),
    (["0,255"], r"thread_siblings\[0\]: the CPUs of one core are on different NUMA nodes"),
])
def test_thread_siblings_are_checked(siblings, error):
    doc = load_topology("dgx-a100").document()
    doc["host"]["thread_siblings"] = siblings
    with pytest.raises(ValueError, match=error):
        Topology.model_validate(doc)


def test_thread_siblings_decide_the_cores():
    doc = load_topology("dgx-a100").document()
    usual = host_type(Topology.model_validate(doc)).numa_cores
    assert bin(usual[0][0]) == bin(1 << 0 | 1 << 128)          # cpu i and i + 128 cores
    doc["host"]["thread_siblings"] = [f"{c},{c + 1}" for c in range(0, 256, 2)]
    paired = host_type(Topology.model_validate(doc)).numa_cores
    assert paired[0][0] == 0b11 and sum(len(c) for c in paired) == 128
