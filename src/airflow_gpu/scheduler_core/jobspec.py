"""The job spec: what a job needs (roles, GPUs, cores, memory) and how to place it.

The same model serves job files, the API and the Airflow operators.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .jobarray import ArraySpec
from .jobdeps import DependsOn, file_cycle
from .newspecs import check_deadline, check_downstream
from .units import Deadline, Duration, Size, format_duration

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
GiB = 2**30
# Host memory a replica books when its spec gives none (like Slurm's DefMemPerGPU and
# DefMemPerCPU); a job class or the queue policy may set their own.
MEMORY_PER_GPU = 16 * GiB
MEMORY_PER_CPU = 1 * GiB
# Caps on one job (the API's and the job files'): no real job comes near them, and they keep
# the cost of checking a spec small and linear whatever is sent.
MAX_ROLES = 64              # roles per job
MAX_REPLICAS = 4096         # replicas per role, and all roles' replicas together
MAX_MODELS = 32             # accepted GPU models per role
MAX_TEXT = 200              # characters in a name, a class or a GPU model
MAX_HOSTS = 4096            # names in placement.hosts


def _one_or_many(v):
    """One name where a list is asked (`model: A100`, `hosts: dgx-01`)."""
    return [v] if isinstance(v, str) else v


# a list of names, or one name for a list of one
Names = Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]],
                  BeforeValidator(_one_or_many)]


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list: `dgx-a-[01-04],dgx-h-05` -> dgx-a-01 .. dgx-a-04, dgx-h-05.
    Entries are split at commas outside `[...]` and expanded as the cluster file expands
    names (engine/cluster.py)."""
    from .engine.cluster import expand_hostnames

    return [name for entry in re.split(r",(?![^\[]*\])", text) if entry.strip()
            for name in expand_hostnames(entry.strip())]


def compress_hostlist(names: list[str]) -> str:
    """The inverse of expand_hostlist, as Slurm's `scontrol show hostlist`: dgx-a-01,
    dgx-a-02, dgx-a-03, dgx-h-05 -> dgx-a-[01-03],dgx-h-05 (names in the order given,
    runs of the same prefix and digit count joined)."""
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    for name in dict.fromkeys(names):
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None:
            order.append(name)
            continue
        key = (m.group(1), len(m.group(2)))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m.group(2)))
    out = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        prefix, width = key
        runs: list[list[int]] = []
        for n in sorted(set(groups[key])):
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        parts = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}"
                 for a, b in runs]
        out.append(f"{prefix}{parts[0]}" if len(parts) == 1 and "-" not in parts[0]
                   else f"{prefix}[{','.join(parts)}]")
    return ",".join(out)


def host_names(entries: list[str], repeats: bool = True,
               fix: str = "name fewer hosts") -> list[str]:
    """The names that host names and ranges give, in order, each once, at most MAX_HOSTS
    (counted while expanding, so a huge range costs little): placement.hosts and a
    reservation's hosts. ValueError naming the entry that goes over, or (`repeats`
    False) the first name given twice."""
    if len(entries) > MAX_HOSTS:
        raise ValueError(f"{len(entries)} entries, over the most that may be named "
                         f"({MAX_HOSTS}); use host ranges such as dgx-[01-16]")
    names: dict[str, str] = {}
    for entry in entries:
        for name in expand_hostlist(entry):
            if not repeats and name in names:
                where = (f"in {entry!r}" if names[name] == entry else
                         f"in {names[name]!r} and in {entry!r}")
                raise ValueError(f"{name} is named twice, {where}; name each host once")
            names.setdefault(name, entry)
        if len(names) > MAX_HOSTS:
            raise ValueError(f"{entry!r} brings the hosts named to more than {MAX_HOSTS}; "
                             f"{fix}")
    return list(names)


def _host_ranges(v):
    """placement.hosts: names or ranges, one string or a list; expanded, duplicates
    dropped (host_names)."""
    entries = _one_or_many(v)
    if not isinstance(entries, list | tuple):
        return entries
    if not all(isinstance(entry, str) for entry in entries[:MAX_HOSTS + 1]):
        return entries                      # the list's own check names the bad item
    return host_names(list(entries), fix="name fewer hosts, or leave hosts out (any host)")


# placement.hosts: names or host ranges (dgx-a-[01-04])
HostNames = Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]],
                      BeforeValidator(_host_ranges)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _no_bool(v, info: ValidationInfo):
    """Counts are numbers: `gpus: true` is refused, not read as 1."""
    if isinstance(v, bool):
        raise ValueError(f"{str(v).lower()} is a yes/no value, not a number; write a whole "
                         f"number such as {info.field_name}: 1")
    return v


class MigRequest(_Spec):
    profile: str = Field(max_length=MAX_TEXT, description="a MIG profile, e.g. 1g.10gb")
    count: int = Field(1, ge=1, le=56, description="MIG devices of that profile per replica")

    _count = field_validator("count", mode="before")(_no_bool)

    @field_validator("profile")
    @classmethod
    def _known(cls, v: str) -> str:
        from .engine.mig import ALL_PROFILES, unknown_profile

        if v not in ALL_PROFILES:
            raise ValueError(unknown_profile(v))
        return v


class GpuConstraint(_Spec):
    model: Names | None = Field(
        None, max_length=MAX_MODELS, description=
        "accepted GPU models, matched as substrings of the GPU name "
        "(e.g. A100 matches 'NVIDIA A100-SXM4-40GB')")
    min_memory: Size | None = Field(None, description="minimum memory per GPU, e.g. 48GiB")
    mig: MigRequest | None = Field(None, description=
                                   "MIG devices instead of whole GPUs: a profile "
                                   "(mig: 1g.10gb) or {profile: 3g.40gb, count: 2}")

    @field_validator("mig", mode="before")
    @classmethod
    def _profile_only(cls, v):
        return {"profile": v} if isinstance(v, str) else v


class Role(_Spec):
    name: str = Field(pattern=_NAME, max_length=MAX_TEXT)
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    gpus: int = Field(0, ge=0, le=64, description="GPUs per replica")
    # a factory: pydantic deep-copies an instance given as the default on every validation
    gpu: GpuConstraint = Field(default_factory=GpuConstraint,
                               json_schema_extra={"default": GpuConstraint().model_dump()})
    cpus: int = Field(1, ge=1, le=4096, description="logical CPUs per replica (exclusive)")
    memory: Size | None = Field(
        None, description="host memory per replica (booked, and the replica's limit); "
        "default: per GPU and per CPU, from the job class or the queue policy")

    _counts = field_validator("replicas", "gpus", "cpus", mode="before")(_no_bool)

    @model_validator(mode="after")
    def _gpu_needs_gpus(self) -> Role:
        if self.gpu.mig is not None:
            if self.gpus:
                raise ValueError(f"gpu.mig: the role asks MIG devices ({self.gpu.mig.profile}) "
                                 f"and {self.gpus} whole GPUs (gpus: {self.gpus}); a replica "
                                 "gets one or the other: remove gpus, or remove gpu.mig")
            if self.gpu.min_memory is not None:
                raise ValueError(f"gpu.min_memory: a MIG device's memory is its profile's "
                                 f"({self.gpu.mig.profile}); remove min_memory, or ask a "
                                 "larger profile")
            return self
        if self.gpus == 0 and (self.gpu.model is not None or self.gpu.min_memory is not None):
            asked = ", ".join(k for k in ("model", "min_memory")
                              if getattr(self.gpu, k) is not None)
            raise ValueError(f"gpu: the role sets GPU constraints ({asked}) but asks for no "
                             "GPUs (gpus: 0); set gpus to the GPUs each replica needs, or "
                             "remove gpu")
        return self

    @field_validator("memory")
    @classmethod
    def _some_memory(cls, v: int | None) -> int | None:
        if v is not None and v <= 0:
            raise ValueError("a replica must book some host memory (it is its limit too); "
                             "give a size such as 8GiB, or leave memory out for the default "
                             "per GPU and per CPU")
        return v

    def booked_memory(self, per_gpu: int = MEMORY_PER_GPU,
                      per_cpu: int = MEMORY_PER_CPU) -> int:
        """Bytes a replica books: its own `memory`, else per GPU and per CPU."""
        return self.memory if self.memory is not None else (
            per_gpu * self.gpus + per_cpu * self.cpus)


class Placement(_Spec):
    pack: bool = Field(True, description="concentrate replicas on as few hosts as possible")
    locality: Literal["host", "nvlink_domain", "switch", "rack", "any"] = Field(
        "any", description="hard limit: all hosts of the job under one "
        "host|nvlink_domain|switch|rack; any: the tightest that holds it, in that order")
    affinity: Literal["strict", "preferred", "none"] = Field(
        "preferred", description="CPU cores and memory on the NUMA node(s) of the GPUs")
    nics: bool = Field(True, description="give GPU replicas the compute NICs behind their GPUs")
    cpu_allocation: Literal["core", "thread"] = Field(
        "core", description="core: whole physical cores (with their SMT siblings; a replica "
        "asking 3 CPUs gets 2 cores, 4 threads); thread: logical CPUs one by one")
    hosts: HostNames | None = Field(
        None, min_length=1, max_length=MAX_HOSTS, description=
        "only these hosts (names from the cluster file, or ranges as there: dgx-a-[01-04]) "
        "may hold the job's replicas, like Slurm's --nodelist; the local runner and "
        "`airflow-gpu run` set it to their machine's host")


# what a job or a team may be notified of (docs/notifications.md)
NOTIFY_EVENTS = ("start", "end", "failure", "preemption", "requeue", "idle", "reservation",
                 "deadline")
NotifyEvent = Literal["start", "end", "failure", "preemption", "requeue", "idle",
                      "reservation", "deadline"]
DEFAULT_NOTIFY = ["end", "failure"]
MAX_URL = 2000


def web_url(v: str) -> str:
    """An http(s) URL the webhook sender can POST to: parsed as it parses it (httpx), with a
    host, a port from 1 to 65535 and no user:password part (URLs are shown to teams)."""
    from .webhookurl import web_url as checked

    return checked(v)


def notify_events(v: list[str]) -> list[str]:
    """Events to notify of, each once, in the order given; at least one. Stored lists
    were kept without repeats, so a repeat is refused: it is a slip (a job's spec, a
    team's webhook_events)."""
    if not v:
        raise ValueError("give at least one of " + ", ".join(NOTIFY_EVENTS)
                         + " (or leave events out: end, failure)")
    again = next((e for i, e in enumerate(v) if e in v[:i]), None)
    if again is not None:
        raise ValueError(f"{again!r} is given twice; give each event once: "
                         f"{', '.join(map(str, dict.fromkeys(v)))}")
    return list(v)


class Notify(_Spec):
    """Where the job's events are POSTed (signed with its team's webhook secret)."""

    url: str = Field(max_length=MAX_URL, description="the webhook: an http(s) URL that "
                     "starts with one of the policy's notifications.allowed_urls")
    events: list[NotifyEvent] = Field(default_factory=lambda: list(DEFAULT_NOTIFY),
                                      description="what to notify of: "
                                      + ", ".join(NOTIFY_EVENTS) + " (default end, failure)")
    _url = field_validator("url")(web_url)
    _events = field_validator("events")(notify_events)


class JobSpec(_Spec):
    name: str = Field(pattern=_NAME, max_length=200)
    team: str = Field("default", pattern=_NAME, max_length=MAX_TEXT)
    user: str | None = Field(None, pattern=_NAME, max_length=MAX_TEXT, description=
                             "who in the team the job is for (fair share within the team, "
                             "accounting); a user's token sets it, the operators set the "
                             "task's owner or the user who triggered the DAG run")
    job_class: str | None = Field(None, max_length=MAX_TEXT)
    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description="higher runs first")
    _priority = field_validator("priority", mode="before")(_no_bool)
    expected_runtime: Duration | None = Field(
        None, gt=0, description="what the job is planned with (an estimate, not "
        "enforced); leave it out to use the job class's")
    time_limit: Duration | None = Field(
        None, gt=0, description="hard limit (Slurm's --time): at it the replicas get "
        "SIGTERM, then SIGKILL after the class's grace, and the job ends timeout; default: "
        "the job class's, else the queue policy's")
    deadline: Deadline | None = Field(
        None, description="when the whole pipeline (the DAG run) must be done, with its "
        "time zone: 2026-12-05T06:00:00Z; its jobs go ahead in their band as the time left "
        "runs short (docs/queue-policy.md, \"Deadlines\")")
    downstream: Duration = Field(0, ge=0, description="with deadline: the work still to "
                                 "run after this job (the longest path of the pipeline's "
                                 "later GPU tasks, at their expected runtimes), e.g. 2h")
    roles: list[Role] = Field(min_length=1, max_length=MAX_ROLES,
                              description=f"at most {MAX_ROLES} roles, {MAX_REPLICAS} "
                              "replicas in all")
    placement: Placement = Field(default_factory=Placement,   # as Role.gpu
                                 json_schema_extra={"default": Placement().model_dump()})
    reservation: str | None = Field(
        None, pattern=_NAME, max_length=MAX_TEXT, description="run only inside this "
        "reservation (one an admin made for the job's team: `airflow-gpu reserve create "
        "... --team`), on its hosts, between its start and its end, like Slurm's "
        "--reservation")
    notify: Notify | None = Field(None, description="a webhook told of the job's events "
                                  "(start, end, failure, ...; docs/notifications.md)")
    # the service's, not the engine's: one job per index, and when a job may start
    array: ArraySpec | None = Field(None, description=
                                    "one job per index, as Slurm's --array: '0-99%8' or "
                                    "{range: '0-99', max_running: 8}")
    depends_on: DependsOn | None = Field(None, description=
                                         "start only once these hold, as Slurm's "
                                         "--dependency: 'afterok:prep,afterany:7c1e' or "
                                         "[{afterok: [prep]}, {afterany: [7c1e]}]")

    @field_validator("deadline", mode="wrap")
    @classmethod
    def _deadline_ahead(cls, v, handler):
        """A new spec's deadline is ahead, and at most a year ahead (newspecs.py)."""
        when = handler(v)
        if when is not None:
            check_deadline(when, v)
        return when

    @field_validator("downstream")
    @classmethod
    def _downstream_of_a_deadline(cls, v: int, info: ValidationInfo) -> int:
        if "deadline" in info.data:        # else the deadline's own error says it
            check_downstream(v, info.data["deadline"])
        return v

    @field_validator("roles", mode="before")
    @classmethod
    def _few_roles(cls, v):
        """Counted before any role is checked, so a huge list costs nothing."""
        if isinstance(v, list | tuple) and len(v) > MAX_ROLES:
            raise ValueError(f"a job has at most {MAX_ROLES} roles, got {len(v)}; give "
                             "replicas of one role instead of many roles alike, or split the "
                             "job")
        return v

    @model_validator(mode="after")
    def _unique_roles(self) -> JobSpec:
        seen: set[str] = set()
        dup = sorted({r.name for r in self.roles if r.name in seen or seen.add(r.name)})
        if dup:
            shown = ", ".join(repr(n) for n in dup[:5]) + (" ..." if len(dup) > 5 else "")
            raise ValueError(f"roles: role names must be unique, {shown} repeats; rename "
                             "them or give one role more replicas")
        total = sum(r.replicas for r in self.roles)
        if total > MAX_REPLICAS:
            raise ValueError(f"roles: {total} replicas in all, over the most a job may have, "
                             f"{MAX_REPLICAS}; lower replicas or split the job")
        if (self.expected_runtime and self.time_limit
                and self.expected_runtime > self.time_limit):
            raise ValueError(f"expected_runtime: {format_duration(self.expected_runtime)} is "
                             f"longer than time_limit {format_duration(self.time_limit)}, so "
                             "the job would be stopped before it is expected to end; raise "
                             "time_limit or lower expected_runtime")
        return self

    @property
    def total_gpus(self) -> int:
        return sum(r.gpus * r.replicas for r in self.roles)

    @property
    def total_mig_devices(self) -> int:
        return sum(r.gpu.mig.count * r.replicas for r in self.roles if r.gpu.mig)


class JobsFile(_Spec):
    jobs: list[JobSpec]

    @model_validator(mode="after")
    def _unique_names(self) -> JobsFile:
        seen: set[str] = set()
        for i, job in enumerate(self.jobs):
            if job.name in seen:
                raise ValueError(f"jobs[{i}].name: job {job.name!r} appears twice; "
                                 "job names must be unique in a file")
            seen.add(job.name)
        found = file_cycle(self.jobs)
        if found:
            raise ValueError(f"jobs[{found[0]}].depends_on: {found[1]}")
        return self
