"""The launch layer's pieces that need no engine: GPU hand-over options, mounts, local
isolation on a machine that lacks the granted CPUs, and the cgroup v2 writer."""

from __future__ import annotations

import itertools
import os

import pytest
from docker.types import DeviceRequest

from airflow_gpu.launch import cgroups
from airflow_gpu.launch.docker import gpu_options, parse_mount
from airflow_gpu.launch.handle import LaunchError
from airflow_gpu.launch.local import isolation
from airflow_gpu.launch.replica import Replica

_JOBS = itertools.count(1)


def replica(cpus, numa=(0,), gpus=(0, 1)) -> Replica:
    """A replica of a job of its own: its cgroup (named by job and replica) is never
    another test's, in this process or another test worker's, which a late cleanup of
    that test could remove under it."""
    return Replica(f"job-{os.getpid()}-{next(_JOBS)}", "worker", 0, 0, "dgx-a-01", "dgx-a-01",
                   None, list(gpus), list(cpus), list(numa), 2**30, ["mlx5_0"])


def test_gpu_modes():
    (req,) = gpu_options("device-request", [2, 5], None)["device_requests"]
    assert req == DeviceRequest(driver="nvidia", device_ids=["2", "5"], capabilities=[["gpu"]])
    (cdi,) = gpu_options("cdi", [2, 5], None)["device_requests"]
    assert cdi["Driver"] == "cdi" and cdi["DeviceIDs"] == ["nvidia.com/gpu=2",
                                                          "nvidia.com/gpu=5"]
    assert gpu_options("env", [2], "nvidia") == {"runtime": "nvidia"}
    assert gpu_options("device-request", [], None) == {}          # CPU-only replica
    with pytest.raises(ValueError, match="gpu_mode: 'mig'"):
        gpu_options("mig", [0], None)


def test_mounts():
    m = parse_mount("/data:/data:ro")
    assert (m["Source"], m["Target"], m["ReadOnly"]) == ("/data", "/data", True)
    with pytest.raises(ValueError, match="mounts: '/data' is not"):
        parse_mount("/data")


def test_replica_environment():
    env = replica([4, 5, 6, 8]).env()
    assert env["AIRFLOW_GPU_CPUS"] == "4-6,8" and env["AIRFLOW_GPU_GPUS"] == "0,1"
    assert env["NCCL_IB_HCA"] == "mlx5_0"


def test_isolation_warns_about_cpus_this_machine_lacks():
    iso = isolation(replica([48, 49, 50, 51], numa=(3,)), strict=False)
    # no cpuset or memory limit; only the GPU device nodes are confined (where allowed)
    assert iso.cpus == [] and not any(d.parts[-3] in ("cpuset", "memory") for d in
                                      (iso.cgroup.dirs if iso.cgroup else []))
    if iso.cgroup:
        iso.cgroup.remove()
    assert any("CPUs 48-51 of the grant are not on this machine" in w for w in iso.warnings)
    assert any("NUMA nodes [3]" in w for w in iso.warnings)
    with pytest.raises(LaunchError, match="strict_isolation=True"):
        isolation(replica([48, 49]), strict=True)


def test_isolation_binds_what_exists():
    mine = sorted(os.sched_getaffinity(0))
    iso = isolation(replica([mine[0], 4000]), strict=False)
    assert iso.cpus == [mine[0]]
    assert any("binding the rest" in w for w in iso.warnings)
    if iso.cgroup:
        iso.cgroup.remove()


def test_cgroup_v2_files(tmp_path):
    """A v2 hierarchy (the CI machine has v1): the writer's files and values."""
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    group = cgroups.create("job-1-worker-0", [0, 1, 2, 5], [0], 3 * 2**30, root=tmp_path)
    leaf = tmp_path / "airflow-gpu" / "job-1-worker-0"
    assert group.version == 2 and group.dirs == [leaf] and group.warnings == []
    assert (leaf / "cpuset.cpus").read_text() == "0-2,5"
    assert (leaf / "cpuset.mems").read_text() == "0"
    assert (leaf / "memory.max").read_text() == str(3 * 2**30)
    assert (tmp_path / "airflow-gpu" / "cgroup.subtree_control").read_text() == \
        "+cpuset +memory"


def test_cgroup_without_rights_warns(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("")
    (tmp_path / "airflow-gpu").write_text("not a directory")
    group = cgroups.create("x", [0], [0], 1, root=tmp_path)
    assert group.dirs == [] and "cannot create cgroup" in group.warnings[0]


def test_a_callable_may_return_more_than_a_pipe_holds():
    """The result travels after the log stream ends: read in that order (as the
    supervisor does), a large return value must not leave both sides waiting."""
    import threading

    from airflow_gpu.launch.local import start_callable

    big = "x" * (1 << 20)
    handle, _ = start_callable(replica([]), lambda: (print("working"), big)[1], (), {}, {})
    got: dict = {}

    def drain():
        got["lines"] = list(handle.lines())
        got["code"] = handle.wait()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    reader.join(timeout=60)
    if reader.is_alive():
        handle.stop()
        pytest.fail("the child and the parent wait on each other")
    assert got == {"lines": ["working"], "code": 0} and handle.value == big
