"""MIG on fake hosts: the fake NVML answers the MIG calls as pynvml does, discovery reports
each GPU's MIG mode and MIG devices (UUIDs, profiles, placements, instance ids), the
engine schedules the reported devices, and the service keeps them with the host (what an
agent reports wins over the cluster file's layout; an agent that says nothing of MIG
keeps the file's)."""

from __future__ import annotations

import ctypes

import pynvml
import pytest
import yaml

from airflow_gpu.agent.discover import discover
from airflow_gpu.scheduler_core.engine.cluster import load_cluster
from airflow_gpu.scheduler_core.engine.hosttype import host_type
from airflow_gpu.scheduler_core.engine.placement import Placed, place
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.engine.topology import load_topology
from airflow_gpu.scheduler_core.plugins import default_registry
from airflow_gpu.scheduler_core.service.agents import compose
from tests.agent.test_agent_service import stack, until  # noqa: F401  (a fixture)
from tests.helpers import job

LAYOUT = ["3g.20gb", "2g.10gb", "2g.10gb"]


def discovered(host):
    host.nvml.nvmlInit()
    try:
        return discover(host.nvml, host.sysfs, host.procfs, "dgx-mig-01")
    finally:
        host.nvml.nvmlShutdown()


def test_the_fake_answers_mig_calls_as_pynvml_does(fake_host):
    nvml = fake_host("dgx-a100").nvml
    devices = nvml.enable_mig(2, LAYOUT)
    nvml.nvmlInit()
    gpu2, gpu0 = nvml.nvmlDeviceGetHandleByIndex(2), nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(gpu2) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert nvml.nvmlDeviceGetMigMode(gpu0) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(gpu2) == 7
    mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, 0)
    assert isinstance(mh, pynvml.c_nvmlDevice_t)
    assert nvml.nvmlDeviceGetUUID(mh) == devices[0].uuid and devices[0].uuid.startswith("MIG-")
    assert isinstance(nvml.nvmlDeviceIsMigDeviceHandle(mh), ctypes.c_uint)
    assert nvml.nvmlDeviceIsMigDeviceHandle(mh).value == 1
    assert nvml.nvmlDeviceIsMigDeviceHandle(gpu2).value == 0
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, 3)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, 7)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):       # whole-GPU calls refuse it
        nvml.nvmlDeviceGetPciInfo(mh)
    gi = nvml.nvmlDeviceGetGpuInstanceId(mh)
    info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(gpu2, gi))
    assert (info.id, info.placement.start, info.placement.size) == (gi, 0, 2)
    prof = nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu2, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)
    name = prof.name.decode() if isinstance(prof.name, bytes) else prof.name
    assert (prof.id, name, prof.sliceCount) == (info.profileId, "MIG 2g.10gb", 2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(
            gpu2, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME)
    assert nvml.nvmlDeviceGetComputeInstanceId(mh) == 0
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mh)
    assert nvml.nvmlDeviceGetIndex(parent) == 2
    nvml.nvmlShutdown()
    volta = fake_host("dgx-1v").nvml
    volta.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        volta.nvmlDeviceGetMaxMigDeviceCount(volta.nvmlDeviceGetHandleByIndex(0))
    volta.nvmlShutdown()


@pytest.mark.parametrize("model, layout", [
    ("dgx-a100", ["3g.20gb", "2g.10gb", "2g.10gb"]),
    ("dgx-h100", ["1g.10gb"] * 7),
    ("dgx-h200", ["4g.71gb", "2g.35gb", "1g.18gb"]),
])
def test_discovery_reports_mig_devices(fake_host, model, layout):
    host = fake_host(model)
    devices = host.nvml.enable_mig(5, layout)
    got = discovered(host)
    assert [g.index for g in got.gpus if g.mig_mode] == [5]
    inst = got.gpus[5].mig_instances
    assert [(i.profile, i.start, i.uuid, i.gpu_instance, i.compute_instance) for i in inst] == [
        (d.profile, d.start, d.uuid, d.gpu_instance, 0) for d in devices]
    assert not any(g.mig_instances for g in got.gpus if g.index != 5)
    # the engine hands the reported devices out, by UUID
    t = host_type(got)
    assert t.mig_gpus == 1 << 5 and [s.uuid for s in t.mig.slices] == [d.uuid for d in devices]


def test_without_privileges_profiles_come_from_the_devices_attributes(fake_host):
    host = fake_host("dgx-a100")
    devices = host.nvml.enable_mig(0, ["4g.20gb", "2g.10gb", "1g.5gb"])
    host.nvml.privileged = False
    inst = discovered(host).gpus[0].mig_instances
    assert [(i.profile, i.start, i.uuid) for i in inst] == [
        (d.profile, None, d.uuid) for d in devices]


def test_a_gpu_with_mig_mode_and_no_devices_takes_no_whole_gpu_job(fake_host):
    host = fake_host("dgx-a100")
    host.nvml.enable_mig(0, [])
    t = discovered(host)
    state = ClusterState(compose_one(t))
    got = place(job("eight", {"name": "w", "gpus": 8}), state, default_registry())
    assert not isinstance(got, Placed)
    (a,) = place(job("seven", {"name": "w", "gpus": 7}), state, default_registry()).allocations
    assert 0 not in a.gpus


def compose_one(topo, file_mig=None):
    """The service's cluster: a file host (with `file_mig`) registered with `topo`."""
    from pathlib import Path
    from tempfile import mkdtemp

    path = Path(mkdtemp()) / "c.yaml"
    entry = {"name": "h1", "model": "dgx-a100", **({"mig": file_mig} if file_mig else {})}
    path.write_text(yaml.safe_dump({"hosts": [entry]}))

    class Row:
        name, topology_hash, rack, switch = "h1", "x", "r", "s"
        docker_url = address = None
        labels: dict = {}

    return compose(load_cluster(path), [Row()], {"x": topo})


def test_reported_devices_win_over_the_declared_layout(fake_host):
    host = fake_host("dgx-a100")
    devices = host.nvml.enable_mig(1, ["7g.40gb"])
    declared = {"gpus": [0], "layout": {"1g.5gb": 7}}
    reported = compose_one(discovered(host), declared).hosts[0].type
    assert reported.mig_gpus == 1 << 1
    assert [(s.gpu, s.profile, s.uuid) for s in reported.mig.slices] == [
        (1, "7g.40gb", devices[0].uuid)]
    # an agent that says nothing of MIG (declared mode) keeps the file's layout
    kept = compose_one(load_topology("dgx-a100"), declared).hosts[0].type
    assert kept.mig_gpus == 1 and [s.profile for s in kept.mig.slices] == ["1g.5gb"] * 7
    assert all(s.uuid is None for s in kept.mig.slices)


def test_the_service_schedules_reported_mig_devices_and_names_them(stack, fake_host):  # noqa: F811
    s = stack()
    host = fake_host("dgx-a100")
    devices = host.nvml.enable_mig(2, LAYOUT)
    s.agent(host, "mig-01").register()
    spec = {"name": "val", "roles": [{"name": "v", "replicas": 2, "cpus": 2, "memory": "4GiB",
                                      "gpu": {"mig": "2g.10gb"}}]}
    submitted = s.team.submit(spec)
    got = until(lambda: (j := s.team.job(submitted["id"]))["state"] == "admitted" and j,
                "the MIG job admitted")
    mig = [m for r in got["replicas"] for m in r["mig"]]
    assert {r["host"] for r in got["replicas"]} == {"mig-01"}
    assert all(r["gpus"] == [] for r in got["replicas"])
    assert sorted(m["uuid"] for m in mig) == sorted(d.uuid for d in devices
                                                    if d.profile == "2g.10gb")
    assert sorted(m["label"] for m in mig) == ["GPU 2 MIG 2g.10gb #0", "GPU 2 MIG 2g.10gb #1"]
    view = s.host("mig-01")
    gpu2 = view["gpus"][2]
    assert gpu2["mig_mode"] and [m["job"] for m in gpu2["mig"]] == [submitted["id"]] * 2 + [None]
    assert [m["team"] for m in gpu2["mig"]] == [submitted["team"]] * 2 + [None]
    assert view["free_gpus"] == 7 and "mig" not in view["gpus"][0]
    # a third 2g.10gb waits, naming who holds the devices
    third = s.team.submit({**spec, "name": "third", "roles": [{**spec["roles"][0],
                                                                "replicas": 1}]})
    why = until(lambda: (s.team.job(third["id"]).get("pending") or {}).get("reason"),
                "a pending reason")
    # named as queue names them (the engine knows jobs by id)
    assert f"held by {spec['name']} ({submitted['id'][:8]}) (mig-01 GPU 2 MIG 2g.10gb #0" in why
