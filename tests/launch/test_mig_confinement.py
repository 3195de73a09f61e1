"""A local replica can open its own MIG devices' capability nodes (/dev/nvidia-caps) and no
other MIG device's, as it can open only its own GPUs' nodes (test_devices.py).

The nodes are real character devices made with mknod: the GPUs' (major 195) and the MIG
capabilities' (a major that /proc/devices names `nvidia-caps` on a machine with the
driver; here a fake /proc/devices names it). The driver's capability files
(/proc/driver/nvidia/capabilities/gpuM/mig/giG[/ciC]/access) and the MIG devices' instance
ids (NVML) are test doubles; the cgroup, the process and what it can open are real.
Opening a node the cgroup allows fails with ENXIO (no driver), one it denies with EPERM."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from airflow_gpu.launch import migdevices
from airflow_gpu.launch.handle import LaunchError
from airflow_gpu.launch.local import start_command
from airflow_gpu.launch.replica import Replica
from airflow_gpu.scheduler_core.engine.topology import load_topology
from tests.agent.fakenvml import FakeNVML
from tests.launch.test_devices import OPEN, leftovers, open_in_group, v1_devices

CAPS_MAJOR = 237                 # any major: nothing is registered for it here


@pytest.fixture
def mig_host(tmp_path, monkeypatch):
    """GPU 0 in MIG mode (2g.10gb, 2g.10gb, 3g.20gb by NVML index), the driver's files
    for its capabilities, and the nodes: nvidia0, nvidia1 and each device's GPU-instance
    and compute-instance capability, plus the MIG `config` capability."""
    nvml = FakeNVML(load_topology("dgx-a100"))
    made = nvml.enable_mig(0, ["3g.20gb", "2g.10gb", "2g.10gb"])
    monkeypatch.setattr(migdevices, "load_nvml", lambda: nvml)
    proc = tmp_path / "proc"
    (proc / "devices").parent.mkdir()
    (proc / "devices").write_text(f"Character devices:\n  1 mem\n195 nvidia\n{CAPS_MAJOR} "
                                  "nvidia-caps\n\nBlock devices:\n  8 sd\n")
    minors, lines = {"config": 1}, ["config 1", "monitor 2"]
    for d in made:
        gi = proc / "capabilities" / "gpu0" / "mig" / f"gi{d.gpu_instance}"
        (gi / "ci0").mkdir(parents=True)
        for path, minor in ((gi, 10 + 2 * d.gpu_instance), (gi / "ci0", 11 + 2 * d.gpu_instance)):
            (path / "access").write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
            name = f"gi{d.gpu_instance}" + ("/ci0" if path.name == "ci0" else "")
            minors[name] = minor
            lines.append(f"gpu0/{name}/access {minor}")
    (proc / "mig-minors").write_text("\n".join(lines) + "\n")
    # (raising=False: on code without MIG confinement the test fails on what opens)
    for name, path in (("PROC_DEVICES", proc / "devices"), ("CAPS_ROOT", proc / "capabilities"),
                       ("MIG_MINORS", proc / "mig-minors")):
        monkeypatch.setattr(migdevices, name, path, raising=False)
    nodes = {}
    for name, major, minor in (("nvidia0", 195, 0), ("nvidia1", 195, 1),
                               *((f"cap-{k.replace('/', '-')}", CAPS_MAJOR, v)
                                 for k, v in minors.items())):
        nodes[name] = tmp_path / name
        try:
            os.mknod(nodes[name], stat.S_IFCHR | 0o666, os.makedev(major, minor))
        except PermissionError:
            pytest.skip("mknod of character devices needs root (CAP_MKNOD)")
    return made, nodes


def replica(mig: list[dict], gpus: list[int] = ()) -> Replica:
    return Replica(f"job-dev-mig-{os.getpid()}", "v", len(gpus), 0, "here", "here", None,
                   list(gpus), sorted(os.sched_getaffinity(0)), [], 2**30, [], mig=mig)


def device(d) -> dict:
    return {"gpu": d.gpu, "index": d.gpu_instance - 1, "profile": d.profile,
            "uuid": d.uuid, "label": f"GPU {d.gpu} MIG {d.profile} #{d.gpu_instance - 1}"}


def opens(r: Replica, nodes: dict[str, Path]) -> dict[str, str]:
    """The real local runner (cgroup and all, strict) opening every node."""
    handle, warnings = start_command(r, [sys.executable, "-c", OPEN, *map(str, nodes.values())],
                                     {}, strict=True)
    lines = list(handle.lines())
    assert handle.wait() == 0 and warnings == [], (lines, warnings)
    assert leftovers() == []
    return dict(line.split() for line in lines)


def test_a_replica_opens_its_own_mig_devices_capabilities_and_no_others(mig_host):
    v1_devices()
    made, nodes = mig_host
    first, second, third = made                 # NVML order: by placement (GPU instance 1..3)
    got = opens(replica([device(second)]), nodes)
    assert got == {"nvidia0": "ENXIO", "nvidia1": "EPERM",          # its GPU only
                   "cap-gi2": "ENXIO", "cap-gi2-ci0": "ENXIO",      # its own device
                   "cap-gi1": "EPERM", "cap-gi1-ci0": "EPERM",      # the others'
                   "cap-gi3": "EPERM", "cap-gi3-ci0": "EPERM",
                   "cap-config": "EPERM"}                           # nor reconfigure MIG
    both = opens(replica([device(first), device(third)]), nodes)
    assert [k for k, v in both.items() if v == "ENXIO"] == [
        "nvidia0", "cap-gi1", "cap-gi1-ci0", "cap-gi3", "cap-gi3-ci0"]
    # a replica of whole GPUs opens no MIG device's capability
    whole = opens(replica([], gpus=[1]), nodes)
    assert [k for k, v in whole.items() if v == "ENXIO"] == ["nvidia1"]


def test_cgroup_v2_device_program_confines_mig_capabilities(mig_host):
    """The v2 path: the BPF device program with the caps rule, on the unified hierarchy."""
    from airflow_gpu.launch import cgroups, devices

    root = cgroups.ROOT if cgroups.version() == 2 else cgroups.ROOT / "unified"
    if cgroups.version(root) != 2 or os.geteuid() != 0:
        pytest.skip("no cgroup v2 hierarchy writable here")
    _, nodes = mig_host
    caps = devices.Caps(CAPS_MAJOR, (14, 15), ())          # GPU instance 2's nodes
    group = cgroups.create(f"job-v2-mig-{os.getpid()}", [], [0], 0, root=root,
                           gpu_minors=[0], caps=caps)
    try:
        assert group.version == 2 and group.warnings == []
        found = dict(zip(nodes, open_in_group(group, list(nodes.values())), strict=True))
    finally:
        group.remove()
    allowed = [k for k, v in found.items() if v == os.strerror(6)]       # ENXIO
    assert allowed == ["nvidia0", "cap-gi2", "cap-gi2-ci0"], found


def test_caps_unknown_is_said_and_strict_refuses(mig_host, monkeypatch):
    made, _ = mig_host

    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(migdevices, "load_nvml", missing)
    caps, warnings = migdevices.caps_rule([device(made[0])])
    assert caps is None
    assert "cannot find the capability nodes of MIG devices GPU 0 MIG 2g.10gb #0" in \
        warnings[0] and "/dev/nvidia-caps" in warnings[0]
    with pytest.raises(LaunchError, match="cannot find the capability nodes of MIG devices"):
        start_command(replica([device(made[0])]), ["true"], {}, strict=True)


def test_the_device_program_and_rules_name_the_caps_major():
    from airflow_gpu.launch import devices

    caps = devices.Caps(CAPS_MAJOR, (12, 13), (1, 2, 12, 13, 14, 15))
    rules = devices.deny_rules([0], caps)
    assert [r for r in rules if r.startswith(f"c {CAPS_MAJOR}:")] == [
        f"c {CAPS_MAJOR}:{m} rwm" for m in (1, 2, 14, 15)]
    assert len(devices.device_program([0], caps)) > len(devices.device_program([0]))
