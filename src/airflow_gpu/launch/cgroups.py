"""A cgroup per local replica: its cpuset, NUMA memory nodes, memory limit and the GPU
device nodes it may open (see devices.py).

cgroup v2 when the unified hierarchy is mounted at the root (with the cpuset and memory
controllers; a device program for the GPUs), else the v1 `cpuset`, `memory` and `devices`
hierarchies. Whatever cannot be written (no root, a read-only /sys/fs/cgroup, a CPU this
machine lacks) is returned as warnings, and the process runs without that limit rather
than not at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..scheduler_core.engine.topology import format_cpulist
from . import devices

ROOT = Path(os.environ.get("AIRFLOW_GPU_CGROUP_ROOT", "/sys/fs/cgroup"))
PARENT = "airflow-gpu"


@dataclass
class Cgroup:
    dirs: list[Path]            # v2: one directory; v1: one per controller
    version: int
    warnings: list[str] = field(default_factory=list)

    def join(self, pid: int = 0) -> None:
        """Move a process (0: the caller) in; the child of a fork inherits it."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid or os.getpid()))

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):        # rmdir fails while the last task is still exiting
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def version(root: Path = ROOT) -> int:
    return 2 if (root / "cgroup.controllers").exists() else 1


def create(name: str, cpus: list[int], mems: list[int], memory_bytes: int,
           root: Path = ROOT, gpu_minors: Sequence[int] | None = None,
           caps: devices.Caps | None = None) -> Cgroup:
    """A cgroup named `airflow-gpu/<name>` with the limits written (as far as allowed):
    the cpuset, NUMA memory nodes and memory limit (none when `cpus` is empty), and with
    `gpu_minors` the GPU device nodes: only those minors of /dev/nvidiaN can be opened
    (and with `caps` only those MIG capability nodes)."""
    values = {"cpus": format_cpulist(cpus), "mems": ",".join(map(str, mems)),
              "memory": str(memory_bytes)} if cpus else None
    if version(root) == 2:
        return _create_v2(root, name, values, gpu_minors, caps)
    return _create_v1(root, name, values, gpu_minors, caps)


def _write(path: Path, value: str, what: str, warnings: list[str]) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError as exc:
        warnings.append(f"cannot set {what} = {value} ({path}: {exc.strerror or exc}); "
                        "the process runs without this limit")
        return False


def _mkdir(path: Path, warnings: list[str],
           unapplied: str = "no cpuset or memory limit is applied") -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        return True
    except OSError as exc:
        warnings.append(f"cannot create cgroup {path} ({exc.strerror or exc}); run the "
                        "worker as root or delegate a writable cgroup subtree to it: "
                        f"{unapplied}")
        return False


def _create_v2(root: Path, name: str, values: dict[str, str] | None,
               gpu_minors: Sequence[int] | None, caps: devices.Caps | None = None) -> Cgroup:
    warnings: list[str] = []
    parent, leaf = root / PARENT, root / PARENT / name
    unapplied = "; ".join((["no cpuset or memory limit is applied"] if values else [])
                          + ([devices.NOT_CONFINED] if gpu_minors is not None else []))
    if not (_mkdir(parent, warnings, unapplied) and _mkdir(leaf, warnings, unapplied)):
        return Cgroup([], 2, warnings)
    if values:
        for level in (root, parent):      # controllers must be enabled on the way down
            _write(level / "cgroup.subtree_control", "+cpuset +memory",
                   "cgroup.subtree_control", warnings)
        _write(leaf / "cpuset.cpus", values["cpus"], "cpuset.cpus", warnings)
        _write(leaf / "cpuset.mems", values["mems"], "cpuset.mems", warnings)
        _write(leaf / "memory.max", values["memory"], "memory.max", warnings)
    if gpu_minors is not None:
        try:
            devices.attach_program(leaf, gpu_minors, caps)
        except OSError as exc:
            warnings.append(f"cannot attach the GPU device program to {leaf} (bpf: "
                            f"{exc.strerror or exc}): {devices.NOT_CONFINED}")
    return Cgroup([leaf], 2, warnings)


def _devices_v1(root: Path, name: str, gpu_minors: Sequence[int],
                warnings: list[str], caps: devices.Caps | None = None) -> Path | None:
    """A v1 `devices` cgroup that denies the GPU minors not granted."""
    hierarchy = root / "devices"
    if not (hierarchy / "devices.deny").exists():
        warnings.append(f"no cgroup v1 devices controller at {hierarchy}: "
                        f"{devices.NOT_CONFINED}")
        return None
    group = hierarchy / PARENT / name
    if not _mkdir(group, warnings, devices.NOT_CONFINED):
        return None
    try:
        for rule in devices.deny_rules(gpu_minors, caps):   # the kernel: one rule a write
            fd = os.open(group / "devices.deny", os.O_WRONLY)
            try:
                os.write(fd, rule.encode())
            finally:
                os.close(fd)
        still = devices.open_minors_v1((group / "devices.list").read_text(), gpu_minors)
    except OSError as exc:
        warnings.append(f"cannot deny the GPUs not granted in {group} ({exc.strerror or exc})"
                        f": {devices.NOT_CONFINED}")
        group.rmdir()
        return None
    if still:
        warnings.append(f"the devices cgroup above {group} allows {', '.join(still)}, which "
                        "rules for single GPUs cannot narrow (a container started with a "
                        "device rule for all of major 195?): the process can open GPUs it "
                        "was not granted")
    return group


def _create_v1(root: Path, name: str, values: dict[str, str] | None,
               gpu_minors: Sequence[int] | None, caps: devices.Caps | None = None) -> Cgroup:
    warnings: list[str] = []
    dirs = []
    if gpu_minors is not None:
        group = _devices_v1(root, name, gpu_minors, warnings, caps)
        if group:
            dirs.append(group)
    if not values:
        return Cgroup(dirs, 1, warnings)
    cpuset = root / "cpuset"
    parent = cpuset / PARENT
    if _mkdir(parent, warnings) and _mkdir(parent / name, warnings):
        # v1 cpusets start empty and refuse tasks until cpus and mems are set, the parent too
        for key in ("cpus", "mems"):
            if not (parent / f"cpuset.{key}").read_text().strip():
                _write(parent / f"cpuset.{key}", (cpuset / f"cpuset.{key}").read_text().strip(),
                       f"{PARENT} cpuset.{key}", warnings)
        ok = _write(parent / name / "cpuset.cpus", values["cpus"], "cpuset.cpus", warnings)
        ok &= _write(parent / name / "cpuset.mems", values["mems"], "cpuset.mems", warnings)
        if ok:
            dirs.append(parent / name)
        else:
            (parent / name).rmdir()
    memory = root / "memory" / PARENT / name
    if _mkdir(memory, warnings):
        if _write(memory / "memory.limit_in_bytes", values["memory"],
                  "memory.limit_in_bytes", warnings):
            dirs.append(memory)
        else:
            memory.rmdir()
    return Cgroup(dirs, 1, warnings)
