"""Discovery on fake hosts built from each built-in model reproduces the model: GPUs and
their memory, NVLink peers and counts (NVSwitch systems included), NUMA node and CPU
affinity, NIC locality, the PCIe groups the engine's GPU tree is made of, and the
`nvidia-smi topo -m` matrix."""

from __future__ import annotations

import pytest
import yaml

from airflow_gpu.agent.discover import discover
from airflow_gpu.agent.pcie import sysfs_bdf
from airflow_gpu.cli import main
from airflow_gpu.scheduler_core.engine.cluster import load_cluster
from airflow_gpu.scheduler_core.engine.hosttype import host_type
from airflow_gpu.scheduler_core.engine.topology import Topology, format_cpulist, load_topology
from tests.agent.conftest import MODELS, FakeHost
from tests.agent.fakesysfs import write_host


def run_discovery(host, **kw) -> Topology:
    host.nvml.nvmlInit()
    try:
        return discover(host.nvml, host.sysfs, host.procfs, "dgx-test-01", **kw)
    finally:
        host.nvml.nvmlShutdown()


def tree(t) -> set[tuple[int, int]]:
    """The engine's GPU locality tree as (level, GPU mask) pairs."""
    out, todo = set(), [host_type(t).tree]
    while todo:
        node = todo.pop()
        out.add((node.level, node.mask))
        todo += node.children
    return out


def groups(t: Topology) -> dict[str, frozenset[str]]:
    """Each GPU's and NIC's locality group, as the set of devices in it."""
    members: dict[str | None, set[str]] = {}
    where = {f"GPU{g.index}": g.pcie_switch for g in t.gpus}
    where |= {n.name: n.pcie_switch for n in t.nics}
    for label, group in where.items():
        members.setdefault(group or label, set()).add(label)
    return {label: frozenset(members[group or label]) for label, group in where.items()}


def matrix(t: Topology) -> dict[tuple[str, str], str]:
    cols = t.topo_matrix.columns
    return {(row, col): cell for row, cells in t.topo_matrix.rows.items()
            for col, cell in zip(cols, cells, strict=True)}


def test_discovery_reports_thread_siblings_that_are_not_the_usual_numbering(fake_host):
    """A host numbering a core's threads next to each other (cpu 2k and 2k + 1): the
    agent sends the siblings it read, so whole cores are whole there too."""
    host = fake_host("dgx-a100")
    cpus = sorted(c for n in host.topo.host.numa_nodes for c in n.cpus)
    doc = host.topo.document()
    doc["host"]["thread_siblings"] = [f"{c},{c + 1}" for c in cpus[::2]]
    topo = Topology.model_validate(doc)
    sysfs, procfs = write_host(topo, host.nvml.pci, host.sysfs.parent.parent / "adjacent")
    got = run_discovery(FakeHost(topo, host.nvml, sysfs, procfs))
    assert got.host.cores() == [[c, c + 1] for c in cpus[::2]]
    assert got.host.cores() != load_topology("dgx-a100").host.cores()


@pytest.mark.parametrize("model", MODELS)
def test_discovery_reproduces_the_model(fake_host, model):
    host = fake_host(model)
    want, got = host.topo, run_discovery(host)
    assert got.model == model
    assert [(g.index, g.name, g.memory_mb) for g in got.gpus] == [
        (g.index, g.name, g.memory_mb) for g in want.gpus]
    for g, w in zip(got.gpus, want.gpus, strict=True):
        assert g.nvlink_peers == w.nvlink_peers, f"GPU{g.index}"
        assert (g.numa_node, g.cpu_affinity) == (w.numa_node, w.cpu_affinity), f"GPU{g.index}"
        assert g.pci_bus_id.startswith("00000000:") and g.uuid.startswith("GPU-")
    assert (got.nvlink.fabric, got.nvlink.links_per_gpu, got.nvlink.generation) == (
        want.nvlink.fabric, want.nvlink.links_per_gpu, want.nvlink.generation)
    assert got.nvlink.switches == want.nvlink.switches
    assert [(n.id, n.socket, n.cpus, n.memory_gb) for n in got.host.numa_nodes] == [
        (n.id, n.socket, n.cpus, n.memory_gb) for n in want.host.numa_nodes]
    h, w = got.host, want.host
    assert (h.cpu_model, h.sockets, h.cores_per_socket, h.threads_per_core, h.total_cores,
            h.total_threads, h.memory_gb) == (w.cpu_model, w.sockets, w.cores_per_socket,
                                              w.threads_per_core, w.total_cores,
                                              w.total_threads, w.memory_gb)
    assert h.thread_siblings is None and h.cores() == w.cores()   # the usual i / i + cores
    nics = {n.name: n for n in got.nics}
    assert sorted(nics) == sorted(n.name for n in want.nics)
    for w in want.nics:
        n = nics[w.name]
        assert (n.numa_node, sorted(n.pix_gpus), sorted(n.pxb_gpus), n.port_speed_gbps) == (
            w.numa_node, sorted(w.pix_gpus), sorted(w.pxb_gpus), w.port_speed_gbps), w.name
        assert (n.role == "compute") == (w.role == "compute"), w.name
    assert [got.gpu_local_nics(g.index) for g in got.gpus] == [
        want.gpu_local_nics(g.index) for g in want.gpus]
    assert groups(got) == groups(want)
    assert tree(got) == tree(want)           # the engine's GPU tree: same sets, same levels
    cells = matrix(got)
    for key, cell in matrix(want).items():
        assert cells[key] == cell, key


def test_the_discovered_document_loads_like_a_built_in_model(fake_host, tmp_path):
    got = run_discovery(fake_host("dgx-a100"))
    path = tmp_path / "discovered.yaml"
    path.write_text(yaml.safe_dump(got.document(), sort_keys=False))
    again = load_topology(str(path))
    assert again == got
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"hosts": [{"name": "n1", "model": str(path)}]}))
    t = load_cluster(cluster).hosts[0].type
    builtin = host_type(load_topology("dgx-a100"))
    assert (t.n_gpus, t.links, t.gpu_nics, t.numa_cpus, t.numa_gpus) == (
        builtin.n_gpus, builtin.links, builtin.gpu_nics, builtin.numa_cpus, builtin.numa_gpus)


def test_sysfs_answers_where_nvml_does_not(fake_host):
    """Without NVML's affinity calls (older drivers) the NUMA node and CPUs come from
    sysfs; without the remote device type the link's remote bus id decides."""
    missing = ("nvmlDeviceGetMemoryAffinity", "nvmlDeviceGetCpuAffinityWithinScope",
               "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetNvLinkRemoteDeviceType",
               "nvmlDeviceGetTopologyCommonAncestor")
    for model in ("dgx-1v", "dgx-a100"):
        host = fake_host(model, missing=missing)
        got = run_discovery(host)
        assert [(g.numa_node, g.cpu_affinity, g.nvlink_peers) for g in got.gpus] == [
            (g.numa_node, g.cpu_affinity, g.nvlink_peers) for g in host.topo.gpus]


def test_a_link_down_weakens_only_its_gpu(fake_host):
    host = fake_host("dgx-h100")
    host.nvml.state[3].links_down = {0, 1}
    got = run_discovery(host)
    assert got.gpus[3].nvlink_peers == {i: 16 for i in range(8) if i != 3}
    assert got.gpus[0].nvlink_peers[1] == 18 and got.gpus[0].nvlink_peers[3] == 16


def test_bus_ids_as_nvml_and_sysfs_write_them():
    assert sysfs_bdf("00000000:0A:00.0") == "0000:0a:00.0"
    assert sysfs_bdf(b"00000001:B7:1F.3") == "0001:b7:1f.3"
    assert sysfs_bdf("0a:00.0") == "0000:0a:00.0"
    with pytest.raises(ValueError, match="not a PCI bus id"):
        sysfs_bdf("GPU-1234")


def parse_topo(text: str) -> tuple[dict[tuple[str, str], str], dict[str, tuple[str, str]]]:
    """`airflow-gpu topo` output -> ((row, column) -> cell, GPU -> (CPU, NUMA affinity))."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "CPU Affinity" in line)
    head = lines[start].split()
    columns = head[:head.index("CPU")]
    cells, affinity = {}, {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        label, *rest = line.split()
        cells |= {(label, c): v for c, v in zip(columns, rest, strict=False)}
        if len(rest) == len(columns) + 2:
            affinity[label] = (rest[-2], rest[-1])
    return cells, affinity


@pytest.mark.parametrize("model", MODELS)
def test_topo_prints_the_models_matrix(fake_host, model, monkeypatch, capsys):
    host = fake_host(model)
    monkeypatch.setattr("airflow_gpu.agent.source.load_nvml", lambda: host.nvml)
    assert main(["topo", "--sysfs", str(host.sysfs), "--procfs", str(host.procfs)]) == 0
    discovered, affinity = parse_topo(capsys.readouterr().out)
    assert main(["topo", "--model", model]) == 0
    declared, _ = parse_topo(capsys.readouterr().out)
    assert declared == matrix(host.topo)
    for key, cell in matrix(host.topo).items():
        assert discovered[key] == cell, key
    nics, columns = [n.name for n in host.topo.nics], host.topo.topo_matrix.columns
    # discovered hosts print NIC rows too, with every column
    assert {k for k in discovered if k[0] in nics} == {(r, c) for r in nics for c in columns}
    assert affinity == {f"GPU{g.index}": (format_cpulist(g.cpu_affinity), str(g.numa_node))
                        for g in host.topo.gpus}


def test_topo_yaml_is_a_model_file(fake_host, monkeypatch, capsys, tmp_path):
    host = fake_host("dgx-2")
    monkeypatch.setattr("airflow_gpu.agent.source.load_nvml", lambda: host.nvml)
    assert main(["topo", "--yaml", "--sysfs", str(host.sysfs),
                 "--procfs", str(host.procfs)]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["schema"] == "gpu-topology/v1" and len(doc["gpus"]) == 16
    Topology.model_validate(doc)


def test_topo_without_nvml_says_what_to_do(fake_host, monkeypatch, capsys):
    host = fake_host("dgx-a100", missing=("nvmlInit",))
    monkeypatch.setattr("airflow_gpu.agent.source.load_nvml", lambda: host.nvml)
    assert main(["topo"]) == 2
    err = capsys.readouterr().err
    assert "NVML cannot start on this host" in err and "--declared" in err
