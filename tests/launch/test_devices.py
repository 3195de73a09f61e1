"""A local replica can open its own GPUs' device nodes and no other GPU's (Slurm's
ConstrainDevices), whatever it sets CUDA_VISIBLE_DEVICES to.

The nodes are real character devices made with mknod (major 195, as /dev/nvidiaN). The
NVIDIA driver is not loaded here, so opening a node the cgroup allows fails with ENXIO
(no such device), and one it denies with EPERM: that difference is what is checked.

The tests of the runner (`run_replica`, `run_callable`) use only what the local runner had
before device confinement, so that on such code they fail on what the process could open
rather than on an import."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path

import pytest

from airflow_gpu.launch import cgroups
from airflow_gpu.launch.local import machine_numa_nodes, start_callable, start_command
from airflow_gpu.launch.replica import Replica

NVIDIA_MAJOR = 195              # /dev/nvidiaN is 195:N, /dev/nvidiactl 195:255

OPEN = ("import errno, os, sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        os.close(os.open(path, os.O_RDWR))\n"
        "        print(os.path.basename(path), 'opened')\n"
        "    except OSError as exc:\n"
        "        print(os.path.basename(path), errno.errorcode[exc.errno])\n")


@pytest.fixture
def nodes(tmp_path) -> dict[str, Path]:
    """nvidia0, nvidia1 (GPUs) and nvidiactl (195:255), made with mknod."""
    made = {}
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        made[name] = tmp_path / name
        try:
            os.mknod(made[name], stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
        except PermissionError:
            pytest.skip("mknod of character devices needs root (CAP_MKNOD)")
    return made


def v1_devices() -> None:
    if cgroups.version() == 2 or not (cgroups.ROOT / "devices" / "devices.deny").exists():
        pytest.skip(f"no cgroup v1 devices controller at {cgroups.ROOT / 'devices'}")
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root")


JOB = f"job-dev-{os.getpid()}"     # cgroups of this test process's own: not another worker's


def replica(gpus: list[int]) -> Replica:
    return Replica(JOB, "worker", len(gpus), 0, "here", "here", None, gpus,
                   sorted(os.sched_getaffinity(0)), machine_numa_nodes()[:1], 2**30, [])


def leftovers() -> list[str]:
    """Replica cgroups of this test's job still in the v1 hierarchies."""
    return [str(d) for c in ("devices", "cpuset", "memory")
            for d in (cgroups.ROOT / c / "airflow-gpu").glob(f"{JOB}-*")]


def run_replica(gpus: list[int], nodes: dict[str, Path], env=None) -> dict[str, str]:
    """The real local runner (cgroup and all, strict) opening every node."""
    handle, warnings = start_command(replica(gpus), [sys.executable, "-c", OPEN,
                                                     *map(str, nodes.values()), "/dev/null"],
                                     env or {}, strict=True)
    lines = list(handle.lines())
    assert handle.wait() == 0 and warnings == [], (lines, warnings)
    assert leftovers() == []                      # the cgroups go with the process
    return dict(line.split() for line in lines)


def open_all(paths: list[str]) -> dict[str, str]:
    """What a @task.gpu callable finds when it opens each node (it runs in the child)."""
    import errno

    found = {}
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDWR))
            found[os.path.basename(path)] = "opened"
        except OSError as exc:
            found[os.path.basename(path)] = errno.errorcode[exc.errno]
    return found


def run_callable(gpus: list[int], nodes: dict[str, Path]) -> dict[str, str]:
    """The real local runner of @task.gpu: a forked child, isolated, runs the callable."""
    handle, warnings = start_callable(replica(gpus), open_all,
                                      ([*map(str, nodes.values()), "/dev/null"],), {}, {},
                                      strict=True)
    lines = list(handle.lines())
    assert handle.wait() == 0 and warnings == [], (lines, warnings)
    assert leftovers() == []
    return handle.value


def test_a_replica_opens_its_own_gpu_and_not_another(nodes):
    v1_devices()
    assert run_replica([0], nodes) == {"nvidia0": "ENXIO", "nvidia1": "EPERM",
                                       "nvidiactl": "ENXIO", "null": "opened"}
    # resetting CUDA_VISIBLE_DEVICES changes nothing: the cgroup decides
    assert run_replica([1], nodes, {"CUDA_VISIBLE_DEVICES": "0,1"}) == {
        "nvidia0": "EPERM", "nvidia1": "ENXIO", "nvidiactl": "ENXIO", "null": "opened"}
    assert run_replica([0, 1], nodes)["nvidia1"] == "ENXIO"
    cpu_only = run_replica([], nodes)             # a replica without GPUs opens none
    assert (cpu_only["nvidia0"], cpu_only["nvidia1"]) == ("EPERM", "EPERM")


def test_a_python_callable_opens_its_own_gpu_and_not_another(nodes):
    """@task.gpu: the forked child joins the replica's cgroup before the callable runs,
    so the callable itself is confined too."""
    v1_devices()
    assert run_callable([1], nodes) == {"nvidia0": "EPERM", "nvidia1": "ENXIO",
                                        "nvidiactl": "ENXIO", "null": "opened"}


def test_a_parent_that_allows_every_gpu_by_wildcard_is_reported(monkeypatch):
    """A container started with --device-cgroup-rule='c 195:* rwm' denies by default
    and allows all GPUs with one rule, which deny rules of single minors do not narrow."""
    v1_devices()
    monkeypatch.setattr(cgroups, "PARENT", f"airflow-gpu-test-{os.getpid()}")
    parent = cgroups.ROOT / "devices" / cgroups.PARENT
    parent.mkdir()
    try:
        (parent / "devices.deny").write_text("a")
        (parent / "devices.allow").write_text("c 195:* rwm")
        group = cgroups.create("job-x-worker-0", [], [0], 0, gpu_minors=[0])
        assert group.dirs == [parent / "job-x-worker-0"]
        (warning,) = group.warnings
        assert "allows c 195:* rwm, which rules for single GPUs cannot narrow" in warning
        group.remove()
    finally:
        for d in (parent / "job-x-worker-0", parent):
            with contextlib.suppress(FileNotFoundError):
                d.rmdir()


def open_in_group(group, paths: list) -> list[str]:
    """A forked child joins `group` and opens each path: "opened" or the error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            group.join()
            found = []
            for path in paths:
                try:
                    os.close(os.open(path, os.O_RDWR))
                    found.append("opened")
                except OSError as exc:
                    found.append(os.strerror(exc.errno))
            os.write(write, "|".join(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        found = f.read().split("|")
    os.waitpid(pid, 0)
    return found


def test_cgroup_v2_device_program(nodes):
    """The v2 path: the BPF device program attached to the replica's cgroup (the unified
    hierarchy, also mounted beside v1 at /sys/fs/cgroup/unified on hybrid machines)."""
    root = cgroups.ROOT if cgroups.version() == 2 else cgroups.ROOT / "unified"
    if cgroups.version(root) != 2 or os.geteuid() != 0:
        pytest.skip("no cgroup v2 hierarchy writable here")
    group = cgroups.create(f"job-v2-{os.getpid()}", [], [0], 0, root=root, gpu_minors=[1])
    try:
        assert group.version == 2 and group.warnings == []
        found = open_in_group(group, list(nodes.values()))
    finally:
        group.remove()
    assert found == [os.strerror(1), os.strerror(6), os.strerror(6)]   # EPERM, ENXIO x2


def test_gpu_minors_come_from_nvml_else_the_index():
    class Nvml:                           # a test double: no GPU on this machine
        class NVMLError(Exception):
            pass

        def __init__(self, minors=None):
            self.minors = minors

        def nvmlInit(self):
            if self.minors is None:
                raise self.NVMLError("Driver Not Loaded")

        def nvmlShutdown(self):
            pass

        def nvmlDeviceGetCount(self):
            return len(self.minors)

        def nvmlDeviceGetHandleByIndex(self, i):
            return ("handle", i)

        def nvmlDeviceGetMinorNumber(self, handle):
            return self.minors[handle[1]]

    from airflow_gpu.launch import devices

    known = devices.minors_from_nvml(Nvml([3, 0, 1, 2]))
    assert known == {0: 3, 1: 0, 2: 1, 3: 2}
    assert devices.gpu_minors([0, 1], known) == [0, 3]
    assert devices.minors_from_nvml(Nvml()) == {}              # no driver
    assert devices.gpu_minors([0, 5], {}) == [0, 5]            # minor = index


def test_deny_rules_and_what_a_v1_list_still_allows():
    from airflow_gpu.launch import devices

    rules = devices.deny_rules([0, 7])
    assert len(rules) == 252 and "c 195:1 rwm" in rules and "c 195:7 rwm" not in rules
    assert "c 195:254 rwm" not in rules and "c 195:255 rwm" not in rules
    assert devices.open_minors_v1("a *:* rwm\n", [0]) == []      # allow by default
    listed = "c 1:3 rwm\nc 195:0 rwm\nc 195:1 rw\nc 195:255 rwm\nc 195:2 m\nb 195:1 rwm\n"
    assert devices.open_minors_v1(listed, [0]) == ["c 195:1 rw"]
    assert devices.open_minors_v1("c *:* rwm\n", [0]) == ["c *:* rwm"]
