"""The bodies of the job routes (pydantic); the OpenAPI at /docs comes from them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, model_validator

from ...jobspec import JobSpec
from ...newspecs import submitting
from ...service.common import _ts, eta_seconds, utcnow
from ...service.duedates import deadline_of
from ...store.models import AllocationRow, EventRow, JobRow
from .base import RequestBody
from .notifications import NotificationOut

if TYPE_CHECKING:
    from ...engine.cluster import Host


class SubmitRequest(RequestBody):
    spec: JobSpec
    idempotency_key: str | None = Field(
        None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$",
        description="the same key (per team) returns the job it created first; Airflow uses "
        "dag id, task id, run id, map index and try number")

    @model_validator(mode="wrap")
    @classmethod
    def _new(cls, data, handler):
        """A spec submitted is a new one: its deadline ahead (newspecs.py), as a file's."""
        with submitting(utcnow()):
            return handler(data)


class FinishRequest(RequestBody):
    outcome: Literal["succeeded", "failed", "timeout", "preempted"] = Field(
        description="timeout: the launcher stopped the replicas at the job's time limit; "
        "preempted: it stopped a preempting job's replicas (the job is requeued)")
    exit_code: int | None = Field(None, ge=-(2**31), le=2**31 - 1)
    attempt: int | None = Field(None, ge=1, le=2**31 - 1, description="the admission the "
                                "launcher started; finishing a later one answers 409")


class MigDeviceOut(BaseModel):
    gpu: int
    index: int = Field(description="its position among the GPU's MIG devices")
    profile: str
    start: int | None = None
    uuid: str | None = Field(None, description="MIG-...; None where only the cluster file "
                             "declares the layout (the launcher asks NVML on the host)")
    label: str = Field(description="e.g. GPU 2 MIG 1g.10gb #3")


class ReplicaOut(BaseModel):
    role: str
    index: int
    host: str
    gpus: list[int]
    cpus: list[int]
    memory_by_numa: dict[str, int]
    nics: list[str]
    live: bool = Field(description="held now; false: history (an admission that ended)")
    mig: list[MigDeviceOut] = Field(default_factory=list, description=
                                    "MIG devices granted instead of whole GPUs")
    admission: int | None = Field(None, description="which of the job's admissions granted "
                                  "it: 1 for the first (a requeued job is admitted again)")
    granted_at: datetime | None = None
    released_at: datetime | None = None
    address: str | None = Field(None, description="where the other replicas reach its host "
                                "(the cluster's address, else the host name); given with "
                                "a job read on its own (GET, heartbeat), else null")
    docker_url: str | None = Field(None, description="its host's Docker engine, where the "
                                   "cluster names one (with address)")

    @classmethod
    def of(cls, a: AllocationRow, admission: int | None = None,
           host: Host | None = None) -> ReplicaOut:
        return cls(role=a.role, index=a.replica, host=a.host, gpus=a.gpus, cpus=a.cpus,
                   memory_by_numa=a.memory_by_numa, nics=a.nics, live=a.live,
                   mig=a.mig or [], admission=admission, granted_at=a.granted_at,
                   released_at=a.released_at,
                   **({"address": host.address or host.name, "docker_url": host.docker_url}
                      if host is not None else {}))


def admissions(allocations: list[AllocationRow], attempt: int) -> list[int | None]:
    """Each allocation's admission number: one admission's grants share their time, and
    the latest is the job's `attempt` (a list of live grants only is the last one)."""
    times = sorted({_ts(a.granted_at) for a in allocations if a.granted_at is not None})
    first = attempt - len(times) + 1 if attempt >= len(times) else 1
    return [first + times.index(_ts(a.granted_at)) if a.granted_at is not None else None
            for a in allocations]


class ReasonOut(BaseModel):
    code: str | None
    reason: str | None
    details: dict[str, Any]
    eta_seconds: float | None


class JobOut(BaseModel):
    id: str
    name: str
    team: str
    user: str | None = Field(None, description="who in the team it is for")
    idempotency_key: str | None = None      # Airflow: dag/task/run/map_index/try
    state: str
    priority: int
    spec: dict[str, Any]
    pending: ReasonOut | None = None
    submitted_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    lease_expires_at: datetime | None
    exit_code: int | None
    gpu_fault: str | None = None    # a GPU it held turned unhealthy (see its events)
    attempt: int = Field(0, description="admissions so far; heartbeat and finish name the "
                         "one they launched")
    deadline_at: datetime | None = Field(None, description="a live job is stopped then "
                                         "(SIGTERM; SIGKILL stop_grace seconds later): its "
                                         "time limit's end, not its pipeline's deadline")
    pipeline_deadline_at: datetime | None = Field(None, description="when its pipeline "
                                                  "must be done (the spec's deadline)")
    deadline_slack_s: int | None = Field(None, description="what it may still lose and its "
                                         "pipeline end in time: waiting, its latest start "
                                         "less now; live or ended, deadline - downstream - "
                                         "its (expected) end; negative: late by that much")
    deadline_at_risk: bool = Field(False, description="its pipeline will miss its deadline "
                                   "unless something changes: live and expected to end "
                                   "after deadline - downstream, or waiting past its latest "
                                   "start or behind a job that lost its deadline")
    time_limit_s: int | None = Field(None, description="its time limit as admitted: from "
                                     "admission to deadline_at")
    stop_grace: int | None = None
    limit_cut_by: str | None = Field(None, description="the job whose reservation it "
                                     "backfilled ahead of")
    yield_at: datetime | None = Field(None, description="backfilled: still running then "
                                      "(past its expected runtime), it is stopped like a "
                                      "preempted job and requeued under the same id")
    borrowed: bool = Field(False, description="admitted beyond its team's guarantee, on "
                           "GPUs other teams leave idle: it may be reclaimed")
    preempted_by: str | None = Field(None, description="the job that preempted it last")
    preempt_reason: str | None = None
    preempt_signal: str | None = Field(None, description="while preempting: the signal its "
                                       "replicas get (SIGKILL preempt_grace seconds later)")
    preempt_grace: int | None = None
    preempt_deadline_at: datetime | None = Field(None, description="while preempting: it is "
                                                 "requeued by force then")
    preemptions: int = 0
    requeue_reason: str | None = Field(None, description="why its last admission was "
                                       "requeued: preempted | overrun | requeued | "
                                       "gpu_fault | idle | reservation")
    reservation: str | None = Field(None, description="the admin's reservation it runs "
                                    "in (its spec's `reservation`)")
    yield_reservation: str | None = Field(None, description="the admin's reservation it "
                                          "yields to at yield_at: still running then, it is "
                                          "stopped and requeued under the same id")
    idle_since: datetime | None = Field(None, description="every GPU it holds has stayed "
                                        "under the idle threshold since then")
    idle_flagged_at: datetime | None = Field(None, description="the idle-GPU policy flagged "
                                             "it then (see idle_since)")
    idle_requeues: int = Field(0, description="how often the idle-GPU policy requeued it "
                               "(held at the policy's idle.hold_after)")
    array_id: str | None = Field(None, description="the array it is an element of (a "
                                 "reference to all of them); null: no array")
    array_index: int | None = Field(None, description="its index in the array "
                                    "(AIRFLOW_GPU_ARRAY_INDEX in its replicas)")
    replicas: list[ReplicaOut] = Field([], description="its grants, the current admission's "
                                       "(live) and, marked live false with their admission, "
                                       "those of admissions that ended")

    @classmethod
    def of(cls, j: JobRow, allocations: list[AllocationRow] | None = None,
           hosts: Mapping[str, Host] | None = None, due: dict | None = None) -> JobOut:
        """`hosts` (the cluster's, by name): each replica with its host's addresses, so a
        launcher needs no read of the whole cluster; `due`: its pipeline deadline's
        fields (service/duedates.py)."""
        return cls(**{"pipeline_deadline_at": deadline_of(j.spec), **(due or {})},
                   id=j.id, name=j.name, team=j.team, user=j.user,
                   idempotency_key=j.idempotency_key,
                   state=j.state, priority=j.priority,
                   spec=j.spec,
                   pending=ReasonOut(code=j.reason_code, reason=j.reason, details=j.details,
                                     eta_seconds=eta_seconds(j)) if j.state == "pending"
                   else None,
                   submitted_at=j.submitted_at, admitted_at=j.admitted_at,
                   started_at=j.started_at, finished_at=j.finished_at,
                   lease_expires_at=j.lease_expires_at, exit_code=j.exit_code,
                   gpu_fault=j.gpu_fault, attempt=j.attempt or 0,
                   deadline_at=j.deadline_at, stop_grace=j.stop_grace,
                   limit_cut_by=j.limit_cut_by, yield_at=j.yield_at,
                   time_limit_s=round(_ts(j.deadline_at) - _ts(j.admitted_at))
                   if j.deadline_at and j.admitted_at else None,
                   borrowed=bool(j.borrowed), preempted_by=j.preempted_by,
                   preempt_reason=j.preempt_reason, preemptions=j.preemptions or 0,
                   requeue_reason=j.requeue_reason, idle_since=j.idle_since,
                   reservation=j.reservation, yield_reservation=j.yield_reservation,
                   idle_flagged_at=j.idle_flagged_at,
                   **({"preempt_signal": j.preempt_signal, "preempt_grace": j.preempt_grace,
                       "preempt_deadline_at": j.preempt_deadline_at}
                      if j.state == "preempting" else {}),
                   idle_requeues=j.idle_requeues or 0,
                   array_id=j.array_id, array_index=j.array_index,
                   replicas=[ReplicaOut.of(a, n, hosts.get(a.host) if hosts else None)
                             for a, n in zip(allocations or [],
                                             admissions(allocations or [], j.attempt or 0),
                                             strict=True)])


class EventOut(BaseModel):
    at: datetime
    kind: str
    message: str

    @classmethod
    def of(cls, e: EventRow) -> EventOut:
        return cls(at=e.at, kind=e.kind, message=e.message)


class ExplainOut(BaseModel):
    id: str
    state: str
    code: str | None
    reason: str | None
    details: dict[str, Any]
    eta_seconds: float | None
    events: list[EventOut]
    elapsed_s: int | None = Field(None, description="since admission: to now while live, "
                                  "to its end once ended")
    time_limit_s: int | None = Field(None, description="its limit as admitted (none: none)")
    pipeline_deadline_at: datetime | None = Field(None, description="as the job's")
    deadline_slack_s: int | None = Field(None, description="as the job's")
    deadline_at_risk: bool = Field(False, description="as the job's")
    limit_cut_by: str | None = None
    preempted_by: str | None = Field(None, description="the job that preempted it last")
    preempt_reason: str | None = None
    preemptions: int = 0
    blockers: list[dict[str, Any]] = Field([], description="the jobs its pending reason "
                                           "names (holding its GPUs, reserved, preempted "
                                           "for it): id, name, team, state")
    notifications: list[NotificationOut] = Field([], description="its webhook "
                                                 "notifications and their delivery state")

    @classmethod
    def of(cls, j: JobRow, events: list[EventRow], now: float,
           due: dict | None = None) -> ExplainOut:
        start = _ts(j.admitted_at) if j.admitted_at else None
        end = _ts(j.finished_at) if j.finished_at else now
        return cls(**{"pipeline_deadline_at": deadline_of(j.spec), **(due or {})},
                   id=j.id, state=j.state, code=j.reason_code, reason=j.reason,
                   details=j.details, eta_seconds=eta_seconds(j),
                   events=[EventOut.of(e) for e in events],
                   elapsed_s=None if start is None else round(max(0.0, end - start)),
                   time_limit_s=round(_ts(j.deadline_at) - start)
                   if j.deadline_at and start is not None else None,
                   limit_cut_by=j.limit_cut_by, preempted_by=j.preempted_by,
                   preempt_reason=j.preempt_reason, preemptions=j.preemptions or 0)
