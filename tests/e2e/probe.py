"""What a process was given, read from /proc and its cgroup files (v1 or v2); printed as
one `PROBE {...}` line, or returned by `probe()`."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def probe() -> dict:
    status = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":\t" in line)
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            groups[c] = path
    if "" in groups and (ROOT / "cgroup.controllers").exists():      # v2
        d = ROOT / groups[""].lstrip("/")
        files = {"cpus": d / "cpuset.cpus", "mems": d / "cpuset.mems", "memory": d / "memory.max"}
    else:
        cs, mem = ROOT / "cpuset" / groups["cpuset"].lstrip("/"), ROOT / "memory" / groups[
            "memory"].lstrip("/")
        files = {"cpus": cs / "cpuset.cpus", "mems": cs / "cpuset.mems",
                 "memory": mem / "memory.limit_in_bytes"}
    return {"affinity": status["Cpus_allowed_list"].strip(),
            "cgroup": {k: _read(v) for k, v in files.items()},
            "cgroup_paths": {k: str(v.parent) for k, v in files.items()},
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("CUDA_", "AIRFLOW_GPU_", "NCCL_"))}}


if __name__ == "__main__":
    print("PROBE " + json.dumps(probe()), flush=True)
