"""A cgroup per local replica: its cpuset, NUMA memory nodes and memory limit.

cgroup v2 when the unified hierarchy is mounted at the root (with the cpuset and memory
controllers), else the v1 `cpuset` and `memory` hierarchies. Whatever cannot be written
(no root, a read-only /sys/fs/cgroup, a CPU this machine lacks) is returned as warnings,
and the process runs without that limit rather than not at all.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..scheduler_core.engine.topology import format_cpulist

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
           root: Path = ROOT) -> Cgroup:
    """A cgroup named `airflow-gpu/<name>` with the limits written (as far as allowed)."""
    values = {"cpus": format_cpulist(cpus), "mems": ",".join(map(str, mems)),
              "memory": str(memory_bytes)}
    if version(root) == 2:
        return _create_v2(root, name, values)
    return _create_v1(root, name, values)


def _write(path: Path, value: str, what: str, warnings: list[str]) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError as exc:
        warnings.append(f"cannot set {what} = {value} ({path}: {exc.strerror or exc}); "
                        "the process runs without this limit")
        return False


def _mkdir(path: Path, warnings: list[str]) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        return True
    except OSError as exc:
        warnings.append(f"cannot create cgroup {path} ({exc.strerror or exc}); run the "
                        "worker as root or delegate a writable cgroup subtree to it: no cpuset "
                        "or memory limit is applied")
        return False


def _create_v2(root: Path, name: str, values: dict[str, str]) -> Cgroup:
    warnings: list[str] = []
    parent, leaf = root / PARENT, root / PARENT / name
    if not (_mkdir(parent, warnings) and _mkdir(leaf, warnings)):
        return Cgroup([], 2, warnings)
    for level in (root, parent):      # controllers must be enabled on the way down
        _write(level / "cgroup.subtree_control", "+cpuset +memory",
               "cgroup.subtree_control", warnings)
    _write(leaf / "cpuset.cpus", values["cpus"], "cpuset.cpus", warnings)
    _write(leaf / "cpuset.mems", values["mems"], "cpuset.mems", warnings)
    _write(leaf / "memory.max", values["memory"], "memory.max", warnings)
    return Cgroup([leaf], 2, warnings)


def _create_v1(root: Path, name: str, values: dict[str, str]) -> Cgroup:
    warnings: list[str] = []
    dirs = []
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
