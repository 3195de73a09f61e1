"""Replicas as local processes (one DGX host, LocalExecutor): CUDA_VISIBLE_DEVICES set to
the granted GPUs, CPU affinity to the granted cores and a cgroup with the cpuset, NUMA
memory nodes and memory limit. What the machine cannot apply (a simulated host's CPUs,
no cgroup rights) is warned about, or refused with `strict=True`."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..scheduler_core.engine.topology import format_cpulist
from . import cgroups
from .handle import LaunchError
from .replica import Replica

STOP_GRACE = 10.0       # seconds between SIGTERM and SIGKILL


def machine_numa_nodes() -> list[int]:
    nodes = Path("/sys/devices/system/node")
    found = [int(p.name[4:]) for p in nodes.glob("node[0-9]*")] if nodes.exists() else []
    return sorted(found) or [0]


@dataclass
class Isolation:
    """What will be applied to a replica's process, and what could not be."""
    cpus: list[int]
    cgroup: cgroups.Cgroup | None
    warnings: list[str]

    def enter(self) -> None:
        """Runs in the child before the command: join the cgroup, bind the CPUs."""
        if self.cgroup:
            self.cgroup.join()
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)


def isolation(r: Replica, strict: bool) -> Isolation:
    warnings = []
    usable = os.sched_getaffinity(0)
    cpus = sorted(set(r.cpus) & usable)
    if len(cpus) < len(r.cpus):
        missing = format_cpulist(sorted(set(r.cpus) - usable))
        warnings.append(f"CPUs {missing} of the grant are not on this machine (it offers "
                        f"{format_cpulist(sorted(usable))}): "
                        + ("binding the rest" if cpus else "no CPU binding")
                        + " (is the host simulated, or the worker not on the admitted host?)")
    mems = sorted(set(r.numa_nodes) & set(machine_numa_nodes()))
    if len(mems) < len(r.numa_nodes):
        warnings.append(f"NUMA nodes {sorted(set(r.numa_nodes) - set(mems))} of the grant "
                        "are not on this machine: memory is not bound to them")
    group = None
    if cpus and mems:
        group = cgroups.create(f"{r.job_id}-{r.name}", cpus, mems, r.memory_bytes)
        warnings += group.warnings
    if strict and warnings:
        if group:
            group.remove()
        raise LaunchError(f"{r.name}: isolation cannot be applied as granted: "
                          + "; ".join(warnings) + " (strict_isolation=True)")
    return Isolation(cpus, group, warnings)


def process_env(r: Replica, extra: dict[str, str]) -> dict[str, str]:
    # PCI bus order makes CUDA's device numbers match NVML's (and the scheduler's)
    return {**os.environ, **r.env(), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, r.gpus)), **extra}


class ProcessHandle:
    def __init__(self, name: str, proc: subprocess.Popen, iso: Isolation):
        self.name, self.proc, self.iso = name, proc, iso
        self._out = proc.stdout

    def lines(self) -> Iterator[str]:
        for raw in self._out:
            yield raw.decode(errors="replace").rstrip("\n")

    def wait(self) -> int:
        code = self.proc.wait()
        self._cleanup()
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        if self.iso.cgroup:
            self.iso.cgroup.remove()


def start_command(r: Replica, command: str | list[str], env: dict[str, str],
                  cwd: str | None = None, strict: bool = False) -> tuple[ProcessHandle,
                                                                         list[str]]:
    """Start a shell command (str) or argv (list); returns the handle and the warnings."""
    iso = isolation(r, strict)
    try:
        proc = subprocess.Popen(command, shell=isinstance(command, str), cwd=cwd,
                                env=process_env(r, env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=iso.enter)
    except (OSError, subprocess.SubprocessError) as exc:
        if iso.cgroup:
            iso.cgroup.remove()
        raise LaunchError(f"{r.name}: cannot start {command!r}: {exc}") from None
    return ProcessHandle(r.name, proc, iso), iso.warnings


class CallableHandle(ProcessHandle):
    """A Python callable run in a forked child; its return value comes back pickled."""

    def __init__(self, name: str, pid: int, out: int, result: int, iso: Isolation):
        self.name, self.pid, self.iso = name, pid, iso
        self._out, self._result, self.code = os.fdopen(out, "rb"), result, None
        self.value: Any = None

    def wait(self) -> int:
        if self.code is None:
            with os.fdopen(self._result, "rb") as f:
                data = f.read()
            _, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
            if self.code == 0 and data:
                self.value = pickle.loads(data)
            self._cleanup()
        return self.code

    def stop(self) -> None:
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self._cleanup()


def start_callable(r: Replica, fn: Callable, args: tuple, kwargs: dict,
                   env: dict[str, str], strict: bool = False
                   ) -> tuple[CallableHandle, list[str]]:
    iso = isolation(r, strict)
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:     # the child: isolate, run, send the result, never return
        code = 1
        try:
            os.setsid()
            os.close(out_r)
            os.close(res_r)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            os.environ.clear()
            os.environ.update(process_env(r, env))
            iso.enter()
            payload = pickle.dumps(fn(*args, **kwargs))
            # End the output first: the parent reads the result only after the log
            # stream ends, and a result larger than a pipe's buffer would wait forever.
            sys.stdout.flush()
            sys.stderr.flush()
            for fd in (1, 2, out_w):
                os.close(fd)
            with os.fdopen(res_w, "wb") as f:
                f.write(payload)
            code = 0
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(out_w)
    os.close(res_w)
    return CallableHandle(r.name, pid, out_r, res_r, iso), iso.warnings

