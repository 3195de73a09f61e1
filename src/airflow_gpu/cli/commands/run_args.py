"""`airflow-gpu run`'s request: its options, the job they build (or the job file's), and
the host it asks for. `run` starts the command on this machine, so it asks for this
machine's host only, as the local runner asks for its worker's (`launch/local.py`
local_host: `[gpu_scheduler] local_host`, $AIRFLOW_GPU_LOCAL_HOST, else the host name;
`*`: any host, for simulated clusters). Every mistake here is refused before anything is
submitted (InputError: one line, exit 2)."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from ...launch.local import ANY_HOST, HOST_VARIABLE, SETTING, LocalHost
from ...scheduler_core.errors import InputError
from ...scheduler_core.jobfile import job_request, read_jobs, wire
from ...scheduler_core.jobspec import JobSpec, expand_hostlist
from ..common import service_args

# flags that build a one-role job when no job file is given
SPEC_FLAGS = ("gpus", "cpus", "memory", "replicas", "job_class", "time_limit",
              "expected_runtime", "name", "team", "priority", "gpu_model", "mig",
              "min_gpu_memory", "nodelist", "exclude")
# a one-role job's fields, named as the flags that set them in errors
FLAG_OF = {"roles[0].gpu.mig.profile": "--mig", "roles[0].gpu.mig.count": "--gpus",
           "roles[0].gpu.model": "--gpu-model", "roles[0].gpu.min_memory": "--min-gpu-memory",
           "roles[0].gpus": "--gpus", "roles[0].cpus": "--cpus", "roles[0].memory": "--memory",
           "roles[0].replicas": "--replicas", "time_limit": "--time-limit",
           "expected_runtime": "--expected-runtime", "job_class": "--job-class",
           "name": "--name", "team": "--team", "priority": "--priority"}


def split_command(rest: list[str]) -> tuple[list[str], list[str]]:
    """`[JOBFILE] [OPTIONS] -- CMD...` as argparse left it: what comes before `--`, and
    the command after it."""
    if "--" not in rest:
        raise InputError("run: put the command after `--`, e.g. `airflow-gpu run --gpus 1 "
                         "-- python eval.py` or `airflow-gpu run job.yaml -- ./train.sh`")
    at = rest.index("--")
    if not rest[at + 1:]:
        raise InputError("run: no command after `--`")
    return rest[:at], rest[at + 1:]


def job_spec(args: argparse.Namespace, command: list[str]) -> dict[str, Any]:
    """One job: from the file, else a one-role job from the flags; with --reservation and
    --dependency (a file's job too) where it runs and what it waits for."""
    spec = _request(args, command)
    if getattr(args, "reservation", None):
        spec = job_request({**spec, "reservation": args.reservation}, "--reservation")
    if spec.get("array") is not None:     # one job per index: each needs its own launcher
        raise InputError("array: run starts one job here, and an array is a job per index; "
                         "submit it with `airflow-gpu submit` (each element's launcher reads "
                         "AIRFLOW_GPU_ARRAY_INDEX), or remove array", args.jobfile)
    if args.dependency is None:
        return spec
    try:
        return job_request({**spec, "depends_on": args.dependency}, "run")
    except InputError as exc:
        raise InputError(str(exc).removeprefix("run: ").replace("depends_on",
                                                               "--dependency", 1)) from None


def _request(args: argparse.Namespace, command: list[str]) -> dict[str, Any]:
    """What the job asks for: the file's job, else a one-role job from the flags."""
    given = [f for f in SPEC_FLAGS if getattr(args, f) is not None]
    if args.jobfile:
        if given:
            raise InputError(f"--{given[0].replace('_', '-')}: give the request in the job "
                             "file or as flags, not both", args.jobfile)
        jobs = read_jobs(args.jobfile)      # as plan and submit read it
        if len(jobs) != 1:
            raise InputError(f"run starts one job, and the file holds {len(jobs)}; keep one "
                             "job spec (or `jobs:` with exactly one)", args.jobfile)
        return wire(jobs[0])
    _check_counts(args)
    name = args.name or re.sub(r"[^A-Za-z0-9_.-]", "-",
                               f"run.{os.path.basename(command[0])}")[:200]
    role: dict[str, Any] = {"name": "main", "cpus": 1 if args.cpus is None else args.cpus}
    gpu: dict[str, Any] = {}
    if args.mig is not None:      # --gpus counts MIG devices, as Slurm's --gpus=TYPE:N
        gpu["mig"] = {"profile": args.mig, "count": 1 if args.gpus is None else args.gpus}
    else:
        role["gpus"] = args.gpus or 0
    if args.gpu_model is not None:
        gpu["model"] = [m.strip() for m in re.split(r"[,|]", args.gpu_model) if m.strip()]
    if args.min_gpu_memory is not None:
        gpu["min_memory"] = args.min_gpu_memory
    if gpu:
        role["gpu"] = gpu
    if args.replicas is not None:
        role["replicas"] = args.replicas
    if args.memory is not None:
        role["memory"] = args.memory
    spec: dict[str, Any] = {"name": name, "roles": [role]}
    for key in ("team", "job_class", "priority", "time_limit", "expected_runtime"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    try:
        return job_request(spec, "run")
    except InputError as exc:     # name the flags, not the fields they fill
        text = str(exc).removeprefix("run: ")
        for field, flag in FLAG_OF.items():
            text = re.sub(rf"(^|; ){re.escape(field)}(?=: )", rf"\g<1>{flag}", text)
        raise InputError(text, "run") from None


def _check_counts(args: argparse.Namespace) -> None:
    """Counts the spec would refuse with its field's name, refused with the flag's."""
    if args.cpus is not None and args.cpus < 1:
        raise InputError(f"--cpus: {args.cpus} logical CPUs per replica; a replica needs at "
                         "least 1 (as `cpus:` in a job file): give --cpus 1 or more, or "
                         "leave it out (1)")
    if args.replicas is not None and args.replicas < 1:
        raise InputError(f"--replicas: {args.replicas}; a job runs at least 1 replica: give "
                         "--replicas 1 or more, or leave it out (1)")
    if args.gpus is not None and args.gpus < (1 if args.mig else 0):
        raise InputError(f"--gpus: {args.gpus} " + (
            f"MIG devices of {args.mig} per replica; give 1 or more (the default is 1)"
            if args.mig else "GPUs per replica; give 0 (a CPU-only job) or more"))
    if args.mig and args.min_gpu_memory:
        raise InputError(f"--min-gpu-memory: a MIG device's memory is its profile's "
                         f"({args.mig}); leave --min-gpu-memory out, or ask a larger profile")
    if args.gpu_model is not None and not re.sub(r"[\s,|]", "", args.gpu_model):
        raise InputError(f"--gpu-model: {args.gpu_model!r} names no GPU model; give models "
                         "such as A100,H100, or leave --gpu-model out (any model)")
    for flag, value, left_out in (("--nodelist", args.nodelist, "any host"),
                                  ("--exclude", args.exclude, "no host excluded")):
        if value is not None and not _hostlist(flag, value):
            raise InputError(f"{flag}: {value!r} names no host; give names or ranges such "
                             f"as dgx-a-[01-04],dgx-h-05, or leave {flag} out ({left_out})")
    if (args.gpu_model or args.min_gpu_memory) and not args.mig and not args.gpus:
        flag = "--gpu-model" if args.gpu_model else "--min-gpu-memory"
        raise InputError(f"{flag}: a GPU constraint, but the job asks for no GPUs; add "
                         "--gpus N (or --mig PROFILE), or leave it out")


# -- the host ------------------------------------------------------------------------------
def _shown(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more"
                                      if len(names) > most else "")


def _known(what: str, names: list[str], hosts: list[str], cluster: str) -> None:
    unknown = [n for n in names if n not in hosts]
    if unknown:
        raise InputError(f"{what}: {_shown(unknown, 4)} "
                         f"{'is no host' if len(unknown) == 1 else 'are no hosts'} of the "
                         f"cluster '{cluster}' (its hosts: {_shown(hosts, 12)}); use the "
                         "names of `airflow-gpu cluster`, or ranges such as dgx-a-[01-04]")


def _hostlist(flag: str, text: str) -> list[str]:
    try:
        return expand_hostlist(text)
    except ValueError as exc:
        raise InputError(f"{flag}: {exc}") from None


def pin_host(spec: dict[str, Any], args: argparse.Namespace, cluster: dict,
             here: LocalHost) -> dict[str, Any]:
    """The spec with the hosts `run` may be granted (placement.hosts): this machine's
    host, which must be in --nodelist (or the job file's placement.hosts) and not in
    --exclude; with local_host = * the hosts those name (all but --exclude), or any."""
    hosts = [h["name"] for h in cluster["hosts"]]
    name = cluster.get("cluster", "?")
    if args.jobfile:
        where = f"{args.jobfile}: placement.hosts"
        listed = JobSpec.model_validate(spec).placement.hosts
        asked = _shown(listed or [])
    else:
        where = "--nodelist"
        listed = _hostlist("--nodelist", args.nodelist) if args.nodelist is not None else None
        asked = args.nodelist
    excluded = _hostlist("--exclude", args.exclude) if args.exclude else []
    _known(where, listed or [], hosts, name)
    _known("--exclude", excluded, hosts, name)
    if not here.names:                       # local_host = *: every host is this machine
        allowed = [h for h in (listed or hosts) if h not in excluded]
        if not allowed:
            raise InputError(f"--exclude: {args.exclude} leaves no host "
                             f"{'of ' + where if listed else 'in the cluster'}; exclude "
                             "fewer hosts")
        chosen = allowed if listed or excluded else None
    else:
        me = next((n for n in here.names if n in hosts), None)
        if me is None:
            raise InputError(
                f"this machine is {here} ({here.source}), which is no host of the cluster "
                f"'{name}' (its hosts: {_shown(hosts, 12)}), and run starts the command "
                f"here. Nothing was submitted. To fix: set {HOST_VARIABLE} (or {SETTING}) "
                f"to this machine's name in the cluster; on a simulated cluster whose hosts "
                f"are all this machine, set it to {ANY_HOST}")
        if listed is not None and me not in listed:
            raise InputError(
                f"{where}: {asked} leaves out this machine, {me} ({here.source}), "
                f"and run starts the command here. Nothing was submitted. To fix: run it on "
                f"one of those hosts, add {me}, or on a simulated cluster set "
                f"{HOST_VARIABLE}={ANY_HOST}")
        if me in excluded:
            raise InputError(
                f"--exclude: {args.exclude} excludes this machine, {me} ({here.source}), "
                f"and run starts the command here. Nothing was submitted. To fix: run it on "
                f"another host, or leave {me} out of --exclude")
        chosen = [me]
    if chosen is None:
        return spec
    return {**spec, "placement": {**(spec.get("placement") or {}), "hosts": chosen}}


def refused(spec: dict[str, Any], exc: Exception) -> InputError:
    """The scheduler's 422; where it is the pin to this machine's host, why the pin."""
    hosts = (spec.get("placement") or {}).get("hosts")
    why = getattr(exc, "detail", exc)
    if not hosts or len(hosts) != 1 or "placement.hosts" not in str(why):
        return InputError(f"the scheduler refused the job: {why}", "run")
    return InputError(f"the scheduler refused the job: {why}. run asks only for this "
                      f"machine's host ({hosts[0]}, as placement.hosts), where it starts the "
                      "command: shrink the job to one host, or run a job across hosts with "
                      "`airflow-gpu submit` and GpuGangOperator(runner='docker')", "run")


def options(p: argparse.ArgumentParser, positional: bool) -> argparse.ArgumentParser:
    if positional:
        p.add_argument("jobfile", nargs="?")
    p.add_argument("--gpus", type=int, help="GPUs per replica (default 0); with --mig, MIG "
                   "devices per replica (default 1)")
    p.add_argument("--cpus", type=int, help="logical CPUs per replica (default 1)")
    p.add_argument("--memory", help="host memory per replica, e.g. 32GiB (default: per GPU "
                   "and per CPU)")
    p.add_argument("--replicas", type=int, help="replicas (default 1); the command runs "
                   "once per replica, all on this machine")
    p.add_argument("--gpu-model", "--constraint", dest="gpu_model", metavar="MODEL[,MODEL]",
                   help="accepted GPU models, substrings of the GPU name, e.g. A100,H100")
    p.add_argument("--min-gpu-memory", metavar="SIZE", help="memory per GPU, e.g. 48GiB")
    p.add_argument("--mig", metavar="PROFILE", help="MIG devices of this profile instead "
                   "of whole GPUs, e.g. 1g.10gb (--gpus: how many)")
    p.add_argument("--nodelist", "-w", metavar="HOSTS", help="hosts the job may run on, "
                   "names or ranges (dgx-a-[01-04],dgx-h-05); must include this machine's")
    p.add_argument("--exclude", "-x", metavar="HOSTS", help="hosts the job must not run "
                   "on, as --nodelist")
    p.add_argument("--job-class", help="e.g. validation, pytorch")
    p.add_argument("--reservation", help="run inside this reservation of your team's "
                   "(airflow-gpu reserve list), as srun --reservation")
    p.add_argument("--time-limit", help="e.g. 1h: SIGTERM then, SIGKILL after the class's "
                   "grace; exit 124")
    p.add_argument("--expected-runtime", help="what the scheduler plans with, e.g. 30m")
    p.add_argument("--name", help="the job's name (default run.<command>)")
    p.add_argument("--team", help="default: the token's team")
    p.add_argument("--priority", type=int)
    p.add_argument("--dependency", metavar="COND", help="start only once these hold, as "
                   "srun --dependency: afterok:JOB[:JOB...], afterany:, afternotok:, "
                   "several joined by commas (it waits pending, showing the reason)")
    p.add_argument("--strict-isolation", action="store_true",
                   help="refuse to start (exit 2) where the cores, memory or GPU device "
                   "nodes cannot be confined as granted, instead of warning")
    p.add_argument("--base-port", type=int, default=29500,
                   help="first rendezvous port for the job class's framework (default 29500)")
    p.add_argument("--poll-interval", type=float, default=1.0,
                   help="seconds between updates of a pending job's status line (its "
                   "admission is told at once; default 1)")
    service_args(p)
    return p
