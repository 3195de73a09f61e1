"""Replicas as local processes (one DGX host, LocalExecutor): CUDA_VISIBLE_DEVICES set to
the granted GPUs, CPU affinity to the granted cores and a cgroup with the cpuset, NUMA
memory nodes, memory limit and the GPU device nodes it may open. What the machine cannot
apply (a simulated host's CPUs, no cgroup rights) is warned about, or refused with
`strict=True`.

A replica granted on another host is never started here (`refuse_other_hosts`): this
machine's name in the cluster comes from `local_host()`."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..scheduler_core.engine.topology import format_cpulist
from . import cgroups, devices
from .handle import LaunchError, signal_of
from .migdevices import caps_rule, parent_gpus, resolve_uuids
from .replica import Replica

STOP_GRACE = 10.0       # seconds between SIGTERM and SIGKILL
HOST_VARIABLE = "AIRFLOW_GPU_LOCAL_HOST"   # this machine's host name (the node agent's too)
ANY_HOST = "*"          # local_host = *: every host is this machine (a simulated cluster)
SETTING = "[gpu_scheduler] local_host"


@dataclass(frozen=True)
class LocalHost:
    """Which cluster host this machine is (`names`; empty: any host) and where that was
    read (`source`)."""
    names: tuple[str, ...]
    source: str

    def matches(self, host: str) -> bool:
        return not self.names or host in self.names

    def __str__(self) -> str:
        return " or ".join(repr(n) for n in self.names) if self.names else ANY_HOST


def local_host(configured: str | None = None, environ: dict[str, str] | None = None,
               hostname: Callable[[], str] = socket.gethostname) -> LocalHost:
    """This machine's name in the cluster, from the first that is set: `configured` (the
    Airflow setting `[gpu_scheduler] local_host`), $AIRFLOW_GPU_LOCAL_HOST (which the node
    agent also takes as its name when it has no --name), else the host name, full or short
    (the agent's default name). `*` in the setting or the variable accepts every host."""
    environ = os.environ if environ is None else environ
    for value, source in ((configured, SETTING), (environ.get(HOST_VARIABLE), HOST_VARIABLE)):
        value = (value or "").strip()
        if value == ANY_HOST:
            return LocalHost((), source)
        if value:
            return LocalHost((value,), source)
    full = hostname()
    return LocalHost(tuple(dict.fromkeys((full, full.split(".")[0]))),
                     f"its host name; neither {SETTING} nor {HOST_VARIABLE} is set")


def airflow_setting(environ: dict[str, str] | None = None) -> str | None:
    """`[gpu_scheduler] local_host` as Airflow on this machine would read it, for launchers
    outside Airflow (`airflow-gpu run`), without importing Airflow (which would write a
    default airflow.cfg where none is): $AIRFLOW__GPU_SCHEDULER__LOCAL_HOST, else the
    setting in $AIRFLOW_CONFIG (default $AIRFLOW_HOME/airflow.cfg, ~/airflow). None where
    neither is set."""
    import configparser

    environ = os.environ if environ is None else environ
    value = environ.get("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST")
    if value is not None:
        return value
    home = environ.get("AIRFLOW_HOME") or "~/airflow"
    path = Path(environ.get("AIRFLOW_CONFIG") or Path(home) / "airflow.cfg").expanduser()
    config = configparser.RawConfigParser(strict=False)
    try:
        config.read(path)
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None
    return config.get("gpu_scheduler", "local_host", fallback=None)


def refuse_other_hosts(replicas: list[Replica], here: LocalHost,
                       runner: str = "the local runner", fix: str | None = None) -> None:
    """Raise before anything starts if a replica was granted on a host this machine is
    not: its GPU indices and cores are that host's, and here they may be another job's.
    `runner` names who starts processes only here; `fix` replaces the Airflow advice
    (`{host}` in it: the first host granted elsewhere)."""
    away = [r for r in replicas if not here.matches(r.host)]
    if not away:
        return
    shown = ", ".join(f"{r.name} on {r.host} (GPUs {','.join(map(str, r.gpus)) or 'none'})"
                      for r in away[:8]) + (f" and {len(away) - 8} more" if len(away) > 8
                                            else "")
    hosts = sorted({r.host for r in away})
    advice = fix.format(host=hosts[0]) if fix else (
        f"run the task on a worker on the granted host (one Airflow queue per host, "
        f"queue='{hosts[0]}' on the operator), or start the replicas as containers on their "
        "hosts' Docker engines (GpuGangOperator(runner='docker') or GpuDockerOperator), "
        "which a gang across hosts needs")
    raise LaunchError(
        f"{len(away)} of the job's {len(replicas)} replica(s) were granted on another host "
        f"than this machine, and {runner} starts processes only here: {shown}. "
        f"This machine is {here} ({here.source}); starting them here would use the GPUs "
        f"and cores of {', '.join(hosts)} on this machine, where other jobs may hold them. "
        f"Nothing was started and the job's GPUs are released. To fix: {advice}; if this "
        f"machine is {hosts[0]} under another name, set {SETTING} (or {HOST_VARIABLE}) to "
        f"its name in the cluster; on a simulated cluster whose hosts are all this machine, "
        f"set {SETTING} = {ANY_HOST}.")


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

    def enter(self, pid: int = 0) -> None:
        """Put a process (0: the caller, a forked child) in the cgroup and bind its CPUs."""
        if self.cgroup:
            self.cgroup.join(pid)
        if self.cpus:
            os.sched_setaffinity(pid, self.cpus)


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
    # the cpuset and memory limit where this machine has the CPUs and NUMA nodes; the
    # GPU device nodes always (a replica without GPUs may open none)
    # one cgroup per admission: a late cleanup of the last attempt's cgroup cannot remove
    # the one a requeued attempt's replica has just joined
    caps, why = caps_rule(r.mig)      # MIG devices: only their own capability nodes
    warnings += why
    group = cgroups.create(f"{r.job_id}-{r.attempt}-{r.name}", cpus if mems else [], mems,
                           r.memory_bytes,
                           gpu_minors=devices.gpu_minors(r.gpus or parent_gpus(r.mig)),
                           caps=caps)
    warnings += group.warnings
    if not group.dirs:
        group = None
    if strict and warnings:
        if group:
            group.remove()
        raise LaunchError(f"{r.name}: isolation cannot be applied as granted: "
                          + "; ".join(warnings) + " (strict_isolation=True)")
    return Isolation(cpus, group, warnings)


def with_mig_uuids(r: Replica) -> Replica:
    """The replica with its MIG devices' UUIDs, resolved here (before any cgroup or fork)
    where the cluster file declared the layout."""
    if all(m.get("uuid") for m in r.mig):
        return r
    uuids = resolve_uuids(r.mig)
    return replace(r, mig=[{**m, "uuid": u} for m, u in zip(r.mig, uuids, strict=True)])


def process_env(r: Replica, extra: dict[str, str]) -> dict[str, str]:
    # PCI bus order makes CUDA's device numbers match NVML's (and the scheduler's); MIG
    # devices are named by UUID (read from NVML here where the agent did not report it)
    visible = resolve_uuids(r.mig) if r.mig else list(map(str, r.gpus))
    return {**os.environ, **r.env(), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(visible), **extra}


class ProcessHandle:
    def __init__(self, name: str, proc: subprocess.Popen, iso: Isolation):
        self.name, self.proc, self.iso = name, proc, iso
        self._out = proc.stdout
        self.killed = False         # a stop sent SIGKILL: it outlived the grace

    def lines(self) -> Iterator[str]:
        for raw in self._out:
            yield raw.decode(errors="replace").rstrip("\n")

    def wait(self) -> int:
        code = self.proc.wait()
        self._cleanup()
        return code

    def stop(self, grace: float | None = None, sig: str | None = None) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal_of(sig))
                self.proc.wait(STOP_GRACE if grace is None else grace)
            except subprocess.TimeoutExpired:
                self.killed = True
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        if self.iso.cgroup:
            self.iso.cgroup.remove()


# The child stops itself before it execs the command; the parent then puts it in its
# cgroup and binds its CPUs, and lets it go on. A preexec_fn would do that in the child,
# but it makes Python fork the whole worker (about 25 ms for a 300 MB Airflow worker)
# where it otherwise uses vfork (about 1 ms).
SHIM = ("/bin/sh", "-c", 'kill -STOP $$ && exec "$@"', "airflow-gpu-replica")


def start_command(r: Replica, command: str | list[str], env: dict[str, str],
                  cwd: str | None = None, strict: bool = False) -> tuple[ProcessHandle,
                                                                         list[str]]:
    """Start a shell command (str) or argv (list); returns the handle and the warnings."""
    r = with_mig_uuids(r)
    iso = isolation(r, strict)
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    try:
        proc = subprocess.Popen([*SHIM, *argv], cwd=cwd, env=process_env(r, env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        if iso.cgroup:
            iso.cgroup.remove()
        raise LaunchError(f"{r.name}: cannot start {command!r}: {exc}") from None
    _isolate_stopped(proc, iso)
    return ProcessHandle(r.name, proc, iso), iso.warnings


def _isolate_stopped(proc: subprocess.Popen, iso: Isolation) -> None:
    """Wait for the shim to stop, isolate it, continue it (it then execs the command)."""
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):           # it never got to the command: its exit code
        proc.returncode = os.waitstatus_to_exitcode(status)
        return
    try:
        iso.enter(proc.pid)
    except OSError as exc:
        # as a failing preexec_fn did: the command does not run outside its isolation
        os.killpg(proc.pid, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait()
        if iso.cgroup:
            iso.cgroup.remove()
        raise LaunchError(f"cannot isolate the replica's process: {exc}") from None
    os.kill(proc.pid, signal.SIGCONT)


class CallableHandle(ProcessHandle):
    """A Python callable run in a forked child; its return value comes back pickled."""

    def __init__(self, name: str, pid: int, out: int, result: int, iso: Isolation):
        self.name, self.pid, self.iso = name, pid, iso
        self._out, self._result, self.code = os.fdopen(out, "rb"), result, None
        self.value: Any = None
        self._ended = threading.Event()
        self.killed = False

    def wait(self) -> int:
        if self.code is None:
            with os.fdopen(self._result, "rb") as f:
                data = f.read()
            _, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
            if self.code == 0 and data:
                self.value = pickle.loads(data)
            self._cleanup()
            self._ended.set()
        return self.code

    def stop(self, grace: float | None = None, sig: str | None = None) -> None:
        """SIGKILL at once; with `grace` (a time limit), SIGTERM first and SIGKILL if the
        callable is still running `grace` seconds later (its log reader reaps it). With
        `sig` (a preemption), that signal first and SIGKILL after `grace` (None: the
        default grace)."""
        if sig is not None and grace is None:
            grace = STOP_GRACE
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                if grace:
                    os.killpg(self.pid, signal_of(sig))
                    if self._ended.wait(grace):
                        return
                self.killed = True
                os.killpg(self.pid, signal.SIGKILL)
        self._cleanup()


def start_callable(r: Replica, fn: Callable, args: tuple, kwargs: dict,
                   env: dict[str, str], strict: bool = False
                   ) -> tuple[CallableHandle, list[str]]:
    r = with_mig_uuids(r)
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
            child_env = process_env(r, env)      # from the worker's environment
            os.environ.clear()
            os.environ.update(child_env)
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

