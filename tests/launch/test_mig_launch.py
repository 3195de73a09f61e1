"""MIG devices at launch: a process sees only its MIG devices (CUDA_VISIBLE_DEVICES by
UUID, read from NVML on the host where the cluster file declared the layout), a container
gets them by UUID (or GPU:INDEX) in its device request, CDI names or
NVIDIA_VISIBLE_DEVICES, and never every GPU. Real processes; real containers where the
engine runs (scripts/ensure-docker.sh)."""

from __future__ import annotations

import itertools
import uuid

import pytest
from docker.types import DeviceRequest

from airflow_gpu.launch import migdevices
from airflow_gpu.launch.docker import DockerLauncher, gpu_options
from airflow_gpu.launch.handle import LaunchError
from airflow_gpu.launch.local import process_env, start_command
from airflow_gpu.launch.replica import Replica, replicas_of
from airflow_gpu.scheduler_core.engine.topology import load_topology
from tests.agent.fakenvml import FakeNVML

_JOBS = itertools.count(1)
UUIDS = ["MIG-1b2c3d4e-0000-5000-8000-000000000001", "MIG-1b2c3d4e-0000-5000-8000-000000000002"]


def device(gpu: int, index: int, profile: str = "1g.5gb", uuid: str | None = None) -> dict:
    return {"gpu": gpu, "index": index, "profile": profile, "start": index, "uuid": uuid,
            "label": f"GPU {gpu} MIG {profile} #{index}"}


def replica(mig: list[dict], job_id: str | None = None) -> Replica:
    return Replica(job_id or f"mig-job-{next(_JOBS)}", "v", 0, 0, "here", "127.0.0.1", None,
                   [], [], [], 64 * 2**20, [], mig=mig)


def test_the_job_apis_replica_brings_its_mig_devices():
    job = {"id": "j1", "replicas": [{"role": "v", "index": 0, "host": "h", "gpus": [],
                                     "cpus": [1], "memory_by_numa": {"0": 1}, "nics": [],
                                     "live": True, "mig": [device(2, 3, uuid=UUIDS[0])]}]}
    (r,) = replicas_of(job, {})
    assert r.mig[0]["uuid"] == UUIDS[0]
    assert r.env()["AIRFLOW_GPU_MIG_DEVICES"] == "GPU 2 MIG 1g.5gb #3"
    assert "MIG GPU 2 MIG 1g.5gb #3" in r.describe()


def test_a_process_sees_only_its_mig_devices():
    r = replica([device(2, 0, uuid=UUIDS[0]), device(2, 1, uuid=UUIDS[1])])
    h, _ = start_command(r, ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES; echo $AIRFLOW_GPU_GPUS"],
                         {}, strict=False)
    lines = list(h.lines())
    assert h.wait() == 0
    assert lines == [f"{UUIDS[0]},{UUIDS[1]}", ""]


def test_declared_devices_are_resolved_through_nvml_on_the_host(monkeypatch):
    nvml = FakeNVML(load_topology("dgx-a100"))
    made = nvml.enable_mig(2, ["3g.20gb", "2g.10gb", "2g.10gb"])
    monkeypatch.setattr(migdevices, "load_nvml", lambda: nvml)
    r = replica([device(2, 2, "3g.20gb")])
    assert process_env(r, {})["CUDA_VISIBLE_DEVICES"] == made[2].uuid
    h, _ = start_command(r, ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"], {})
    assert list(h.lines()) == [made[2].uuid] and h.wait() == 0
    assert nvml.initialized == 0                      # NVML is shut down again
    wrong = replica([device(2, 0, "3g.20gb")])        # the host's #0 is a 2g.10gb
    with pytest.raises(LaunchError, match="GPU 2 of this host has MIG devices #0 2g.10gb"):
        process_env(wrong, {})


def test_without_uuids_or_nvml_the_launch_says_how_to_fix_it(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(migdevices, "load_nvml", missing)
    with pytest.raises(LaunchError, match="GPU 1 MIG 1g.5gb #4 have no UUID .* run the node "
                                          "agent"):
        process_env(replica([device(1, 4)]), {})


def test_container_options_name_mig_devices():
    mig = [device(2, 0, uuid=UUIDS[0]), device(3, 1)]
    (req,) = gpu_options("device-request", [], None, mig)["device_requests"]
    assert req == DeviceRequest(driver="nvidia", device_ids=[UUIDS[0], "3:1"],
                                capabilities=[["gpu"]])
    (cdi,) = gpu_options("cdi", [], None, mig)["device_requests"]
    assert cdi["DeviceIDs"] == ["nvidia.com/gpu=2:0", "nvidia.com/gpu=3:1"]
    assert gpu_options("env", [], "nvidia", mig) == {"runtime": "nvidia"}


def test_a_container_gets_its_mig_devices_by_uuid(image):
    """gpu_mode env: NVIDIA_VISIBLE_DEVICES names the MIG devices (the NVIDIA runtime
    reads it on a GPU host; the test engine has none, so the container just shows it)."""
    launcher = DockerLauncher(image=image, command=["sh", "-c", "env | sort"],
                              gpu_mode="env", network_mode="none", shm_size=None)
    r = replica([device(2, 0, uuid=UUIDS[0]), device(2, 1, uuid=UUIDS[1])],
                job_id=uuid.uuid4().hex)
    h = launcher.start(r, {})
    env = dict(line.split("=", 1) for line in h.lines() if "=" in line)
    assert h.wait() == 0
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{UUIDS[0]},{UUIDS[1]}"
    assert env["AIRFLOW_GPU_MIG_DEVICES"] == "GPU 2 MIG 1g.5gb #0;GPU 2 MIG 1g.5gb #1"
    assert env["AIRFLOW_GPU_GPUS"] == ""


def test_a_mig_container_is_not_given_void(image):
    """A CPU-only replica gets NVIDIA_VISIBLE_DEVICES=void; a MIG replica must not."""
    launcher = DockerLauncher(image=image, command=["true"], network_mode="none",
                              shm_size=None)
    created = launcher.create(replica([device(0, 0, uuid=UUIDS[0])],
                                      job_id=uuid.uuid4().hex), {})
    try:
        env = created.attrs["Config"]["Env"]
        requests = created.attrs["HostConfig"]["DeviceRequests"]
    finally:
        created.remove(force=True)
    assert "NVIDIA_VISIBLE_DEVICES=void" not in env
    assert requests[0]["DeviceIDs"] == [UUIDS[0]] and requests[0]["Driver"] == "nvidia"


def test_operators_ask_mig_devices():
    from airflow_gpu.operators.docker import GpuDockerOperator

    op = GpuDockerOperator(task_id="t", image="x", mig={"profile": "3g.40gb", "count": 2},
                           cpus=4)
    (role,) = op._spec("dag.t", "vision")["roles"]
    assert role["gpu"] == {"mig": {"profile": "3g.40gb", "count": 2}} and role["gpus"] == 0
    with pytest.raises(ValueError, match=r"roles\[0\]\.gpu\.mig\.profile: .*'1g\.10gbb'"):
        GpuDockerOperator(task_id="t", image="x", mig="1g.10gbb")
