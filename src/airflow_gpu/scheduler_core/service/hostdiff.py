"""What differs between two models of one host, in the terms its jobs were placed in: GPU
names and memory, MIG layouts, NUMA nodes (ids, CPUs, memory) and NICs (names, which
GPUs they serve), and the addresses its jobs are launched and reached through. A host with
live allocations keeps the model and addresses it is scheduled with while any of these
would change (agents.py)."""

from __future__ import annotations

import re

from ..engine.hosttype import GiB, HostType, MiB, bits
from ..engine.topology import format_cpulist


def changes(old: HostType, new: HostType) -> list[str]:
    """Readable differences that matter to jobs placed on `old`; [] if none."""
    out = []
    out += _per_gpu("GPU", old.gpu_name, new.gpu_name, str)
    out += _per_gpu("GPU memory of GPU", old.gpu_mem, new.gpu_mem, _size)
    out += _per_gpu("MIG layout of GPU", _mig(old), _mig(new), str)
    numa_old, numa_new = _numa(old), _numa(new)
    if numa_old != numa_new:
        out.append(f"NUMA nodes: {numa_old} -> {numa_new}")
    nics_old, nics_new = _nic_names(old), _nic_names(new)
    if nics_old != nics_new:
        out.append(f"NICs: {_names(nics_old)} -> {_names(nics_new)}")
    else:
        out += _per_gpu("NICs of GPU", old.gpu_nics, new.gpu_nics, _names)
    return out


LAUNCH = ("docker_url", "address")      # where a host's jobs are launched and reached


def launch_changes(old: dict, new: dict) -> list[str]:
    """Readable differences of two hosts' launch addresses (LAUNCH); [] if none."""
    return [f"{k}: {old.get(k) or 'none'} -> {new.get(k) or 'none'}" for k in LAUNCH
            if (old.get(k) or None) != (new.get(k) or None)]


def _per_gpu(what: str, old: list, new: list, show) -> list[str]:
    """One line per run of GPUs with the same change ("GPUs 0-7: A -> B")."""
    n = max(len(old), len(new))
    pairs = [(show(old[i]) if i < len(old) else "no GPU",
              show(new[i]) if i < len(new) else "no GPU") for i in range(n)]
    out, i = [], 0
    while i < n:
        j = i
        while j + 1 < n and pairs[j + 1] == pairs[i]:
            j += 1
        a, b = pairs[i]
        if a != b:
            label = f"{what} {i}" if i == j else f"{what}s {i}-{j}"
            out.append(f"{label}: {a} -> {b}")
        i = j + 1
    return out


def _mig(t: HostType) -> list[str]:
    """Per GPU: `whole`, or `MIG` and its devices' profiles."""
    out = ["whole"] * t.n_gpus
    if t.mig is not None:
        for g in bits(t.mig.gpus):
            out[g] = "MIG [" + ", ".join(s.profile for s in t.mig.slices if s.gpu == g) + "]"
    return out


def _numa(t: HostType) -> str:
    return ", ".join(f"{nid} (CPUs {format_cpulist(bits(cpus))}, {_size(mem)})"
                     for nid, cpus, mem in zip(t.numa_ids, t.numa_cpus, t.numa_mem,
                                               strict=True))


def _nic_names(t: HostType) -> list[str]:
    return sorted({n.name for n in t.topo.nics}, key=_natural)


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _names(names: list[str]) -> str:
    """mlx5_0..mlx5_11 for a run of numbered names, else the names; 'none' for none."""
    if not names:
        return "none"
    found = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if len(names) > 2 and all(found) and len({m[1] for m in found}) == 1:
        numbers = sorted(int(m[2]) for m in found)
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{found[0][1]}{numbers[0]}..{found[0][1]}{numbers[-1]}"
    return ",".join(names)


def _size(n: int) -> str:
    return f"{n // GiB} GiB" if n % GiB == 0 else f"{n / MiB:.0f} MiB"
