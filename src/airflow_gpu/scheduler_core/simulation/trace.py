"""Job traces: `job_id,submit_time,duration,num_gpus[,team,priority,job_class,
expected_runtime,time_limit,reservation,dag_run,upstream,deadline]`.

Times are seconds (`submit_time` since the trace's start). `expected_runtime` is what the
scheduler is told (an estimate: it never stops a job), `time_limit` a hard limit (a job
still running at it ends `timeout`); where a job has neither, `estimates.py` derives them.
Pipelines (pipelines.py): `dag_run` names the pipeline a job belongs to, `upstream` the
jobs of the trace it starts after (ids separated by `;` or spaces), `deadline` when its
pipeline must be done (seconds since the trace's start).
A bad line is an error that names the file, the line, the column, the value and the fix.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, utf8_text, validate
from ..jobdeps import cycle
from ..jobspec import JobSpec

REQUIRED = ("job_id", "submit_time", "duration", "num_gpus")
OPTIONAL = ("team", "priority", "job_class", "expected_runtime", "time_limit",
            "reservation", "dag_run", "upstream", "deadline")
FORM = ("job_id,submit_time,duration,num_gpus[,team,priority,job_class,expected_runtime,"
        "time_limit,reservation,dag_run,upstream,deadline]")


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit: float
    duration: float
    gpus: int
    team: str = "default"
    priority: int = 0
    job_class: str | None = None
    expected_runtime: float | None = None
    line: int = 0
    time_limit: float | None = None
    reservation: str | None = None     # the admin's reservation it runs in (--reservations)
    dag_run: str | None = None         # its pipeline (pipelines.py)
    upstream: tuple[str, ...] = ()     # the jobs it starts after
    deadline: float | None = None      # when its pipeline must be done

    @property
    def planned(self) -> float:
        """The runtime the scheduler plans with: the estimate, else the limit (as Slurm
        does), else the real duration."""
        return self.expected_runtime or self.time_limit or self.duration


def _number(raw: str, column: str, where: str, integer: bool = False,
            positive: bool = False) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise InputError(f"{where}: column '{column}': {raw!r} is not {kind}; "
                         f"write {kind} of seconds/GPUs") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "greater than 0" if positive else "0 or more"
        raise InputError(f"{where}: column '{column}': {raw!r} must be {need}")
    return value


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceJob]:
    """The first `limit` jobs (all if None) of a trace file, in file order."""
    path = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the trace: {exc.strerror}", path) from None
    with io.StringIO(utf8_text(data, path), newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise InputError(f"line 1: missing column {', '.join(map(repr, missing))}; "
                             f"the header must be {FORM}", path)
        for h in header:
            if h not in REQUIRED + OPTIONAL:
                close = difflib.get_close_matches(h, REQUIRED + OPTIONAL, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise InputError(f"line 1: unknown column {h!r}{hint}; the columns are {FORM}",
                                 path)
        col = {h: i for i, h in enumerate(header)}
        jobs: list[TraceJob] = []
        seen: set[str] = set()
        for lineno, row in enumerate(reader, start=2):
            if limit is not None and len(jobs) >= limit:
                break
            if not row or all(not c.strip() for c in row):
                continue
            where = f"{path}: line {lineno}"
            if len(row) != len(header):
                raise InputError(f"{where}: {len(row)} values for {len(header)} columns "
                                 f"({', '.join(header)})")
            jobs.append(_row(row, col, where, lineno, seen))
    check_upstream(jobs, path)
    return jobs


def _row(row: list[str], col: dict[str, int], where: str, lineno: int,
         seen: set[str]) -> TraceJob:
    def get(name: str) -> str | None:
        i = col.get(name)
        v = row[i].strip() if i is not None else ""
        return v or None

    job_id = get("job_id")
    if job_id is None:
        raise InputError(f"{where}: column 'job_id' is empty; give each job an id")
    if job_id in seen:
        raise InputError(f"{where}: column 'job_id': {job_id!r} appears twice; ids must be "
                         "unique")
    seen.add(job_id)
    values = {}
    for name, integer, positive in (("submit_time", False, False), ("duration", False, True),
                                    ("num_gpus", True, True)):
        raw = get(name)
        if raw is None:
            raise InputError(f"{where}: column '{name}' is empty")
        values[name] = _number(raw, name, where, integer, positive)
    priority = get("priority")
    expected, limit = get("expected_runtime"), get("time_limit")
    deadline = get("deadline")
    return TraceJob(
        job_id, values["submit_time"], values["duration"], int(values["num_gpus"]),
        get("team") or "default",
        int(_number(priority, "priority", where, integer=True)) if priority else 0,
        get("job_class"),
        _number(expected, "expected_runtime", where, positive=True) if expected else None,
        lineno, _number(limit, "time_limit", where, positive=True) if limit else None,
        get("reservation"), get("dag_run"),
        tuple(u for u in (get("upstream") or "").replace(";", " ").split() if u),
        _number(deadline, "deadline", where) if deadline else None)


def job_spec(t: TraceJob, host_gpus: int, cpus_per_gpu: int, memory_per_gpu: int) -> JobSpec:
    """A trace job as a gang: one replica when it fits a host, else whole hosts' GPUs
    (plus one replica with the rest when the count is not a multiple of a host)."""
    def role(name: str, replicas: int, gpus: int) -> dict:
        return {"name": name, "replicas": replicas, "gpus": gpus,
                "cpus": max(1, cpus_per_gpu * gpus), "memory": f"{memory_per_gpu * gpus}B"}

    whole, rest = divmod(t.gpus, host_gpus)
    roles = [role("worker", whole, host_gpus)] if whole else []
    if rest:
        roles.append(role("rest" if whole else "worker", 1, rest))
    name = t.job_id if t.job_id[0].isalnum() else f"job-{t.job_id}"
    limit = {"time_limit": math.ceil(t.time_limit)} if t.time_limit else {}
    if t.reservation:
        limit["reservation"] = t.reservation
    return validate(JobSpec, {"name": name, "team": t.team, "priority": t.priority,
                              "job_class": t.job_class, "roles": roles, **limit},
                    f"trace line {t.line} (job {t.job_id!r})")


def check_upstream(jobs: list[TraceJob], path: str) -> None:
    """Every upstream id names another job of the trace, and no job waits for itself
    through a cycle (jobdeps.cycle, as for a job file's dependencies)."""
    ids = {t.job_id: t for t in jobs}
    for t in jobs:
        for u in t.upstream:
            if u not in ids:
                raise InputError(f"{path}: line {t.line}: column 'upstream': {u!r} is not a "
                                 "job of the trace (give the job_id of an earlier line)")
            if u == t.job_id:
                raise InputError(f"{path}: line {t.line}: column 'upstream': job {u!r} "
                                 "cannot wait for itself")
    found = cycle({t.job_id: list(t.upstream) for t in jobs})
    if found is not None:
        raise InputError(f"{path}: line {ids[found[0]].line}: column 'upstream': job "
                         f"{found[0]!r} waits for itself through {' -> '.join(found)}; "
                         "remove one of them")
