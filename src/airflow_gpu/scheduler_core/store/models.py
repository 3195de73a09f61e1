"""Tables of the service. A GPU or core is held by at most one live allocation: the hold
tables' primary keys are (host, gpu) and (host, cpu), and rows live only while held, so the
database itself refuses a double booking."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAME = 200
URL = 2000          # a webhook's URL


class UtcDateTime(TypeDecorator):
    """A time column, read back as an aware UTC datetime on every database: SQLite keeps
    no zone (it holds the UTC time written, which this type makes sure of) and PostgreSQL
    answers in its session's zone. Every time the API answers then carries an offset."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(UTC)
        return value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: UtcDateTime}


class HostRow(Base):
    __tablename__ = "hosts"
    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME))
    rack: Mapped[str] = mapped_column(String(NAME))
    switch: Mapped[str] = mapped_column(String(NAME))
    docker_url: Mapped[str | None] = mapped_column(String(1000))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    # why it is drained, since when and by whom (cleared when it is resumed)
    drain_reason: Mapped[str | None] = mapped_column(Text)
    drained_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    drained_by: Mapped[str | None] = mapped_column(String(NAME))
    reported_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Set by the host's node agent: a host with an agent that goes silent is unreachable.
    address: Mapped[str | None] = mapped_column(String(1000))
    registered_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    topology: Mapped[dict[str, Any] | None] = mapped_column()   # gpu-topology/v1 document
    topology_hash: Mapped[str | None] = mapped_column(String(64))


class GpuRow(Base):
    """One GPU of a host: what it is, and its health as last reported."""

    __tablename__ = "gpus"
    host: Mapped[str] = mapped_column(ForeignKey("hosts.name"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME))
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    numa_node: Mapped[int] = mapped_column(Integer)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    health_reason: Mapped[str | None] = mapped_column(Text)
    reported_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # the latest utilization sample from the node agent
    utilization_gpu: Mapped[float | None] = mapped_column(Float)        # percent
    utilization_memory: Mapped[float | None] = mapped_column(Float)     # percent
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    power_watts: Mapped[float | None] = mapped_column(Float)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    # what DCGM or NVML say beyond hard faults: counters whose rise, and thermal
    # throttling, make the GPU "worn" (scored down for long jobs, never excluded)
    uuid: Mapped[str | None] = mapped_column(String(100))
    energy_joules: Mapped[float | None] = mapped_column(Float)      # counter since boot
    sm_active: Mapped[float | None] = mapped_column(Float)          # percent
    ecc_corrected_total: Mapped[int | None] = mapped_column(BigInteger)
    nvlink_errors_total: Mapped[int | None] = mapped_column(BigInteger)
    thermal_throttle: Mapped[bool | None] = mapped_column(Boolean)
    ecc_rose_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    nvlink_rose_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("team", "idempotency_key", name="uq_jobs_team_key"),
        # the pass reads the pending jobs it may consider (blocked NULL) without reading
        # those that wait for a dependency or their array's turn
        Index("ix_jobs_state_blocked", "state", "blocked"),
        # an array's elements by state: how many hold a turn, the next ones to let in
        Index("ix_jobs_array", "array_id", "state", "blocked", "array_index"))
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME))
    team: Mapped[str] = mapped_column(String(NAME), index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(NAME))
    spec: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[str] = mapped_column(String(20), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    reason_code: Mapped[str | None] = mapped_column(String(40))
    reason: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    eta_at: Mapped[float | None] = mapped_column(Float)   # planned start, epoch seconds
    submitted_at: Mapped[datetime] = mapped_column(UtcDateTime)
    admitted_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    outcome: Mapped[str | None] = mapped_column(String(20))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    # admissions so far; a launcher names the one it started, so a requeued and
    # re-admitted job cannot be confirmed or finished by the launch before it
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # a GPU of the job turned unhealthy while it held it: which one, why, and when
    gpu_fault: Mapped[str | None] = mapped_column(Text)
    gpu_fault_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # time limits: when a live job is stopped (SIGTERM; gone after stop_grace seconds),
    # the job whose reservation it backfilled ahead of, and a pending protected
    # job's promised start (epoch seconds), which no backfilled job may delay
    deadline_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    stop_grace: Mapped[int | None] = mapped_column(Integer)
    limit_cut_by: Mapped[str | None] = mapped_column(String(36))
    promised_at: Mapped[float | None] = mapped_column(Float)
    # a backfilled job's yield: from then job limit_cut_by's reservation needs its
    # resources; still running then, it is stopped like a preempted job and requeued
    # (overrun.py). Its time limit (deadline_at) stays its own.
    yield_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # preemption: the job that stopped it last and why, when it must be gone by (while
    # `preempting`; then it is requeued by force), every job that ever preempted it (none
    # of them is ever preempted by it), whether it runs on borrowed quota, why its last
    # admission was requeued ("preempted", "gpu_fault") and how often it was preempted
    preempted_by: Mapped[str | None] = mapped_column(String(36))
    preempt_reason: Mapped[str | None] = mapped_column(Text)
    preempt_deadline_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    preempt_signal: Mapped[str | None] = mapped_column(String(10))   # its class's
    preempt_grace: Mapped[int | None] = mapped_column(Integer)       # seconds to SIGKILL
    preemptors: Mapped[list[Any] | None] = mapped_column()
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    requeue_reason: Mapped[str | None] = mapped_column(String(20))
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # idle-GPU policy: since when every GPU of the job stays under the threshold, when it
    # was flagged for it (a warning, an event), and when the action was taken
    idle_since: Mapped[datetime | None] = mapped_column(UtcDateTime)
    idle_flagged_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # how often the idle policy requeued it (held at `idle.hold_after`), and when it was
    # last requeued for it: it then waits at the back of its band, aging from that time
    idle_requeues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    queued_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # SHA-256 of the spec as submitted (every default filled in), for jobs with an
    # idempotency key: a submit reusing the key with another spec is refused, whatever
    # changed in the job since
    spec_digest: Mapped[str | None] = mapped_column(String(64))
    # the admin's reservation it asks for (its spec's), and the one it yields to: still
    # running at that reservation's start, it is stopped and requeued (overrun.py)
    reservation: Mapped[str | None] = mapped_column(String(NAME), index=True)
    yield_reservation: Mapped[str | None] = mapped_column(String(NAME))
    # who in the team it is for (its spec's user): fair share inside the team, accounting
    user: Mapped[str | None] = mapped_column(String(NAME), index=True)
    # the spec's `notify` (url, events), kept apart so an event's notifications are
    # found without reading specs; None: the job asked for none
    notify: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # job arrays (service/arrays.py): the array an element belongs to and its index
    array_id: Mapped[str | None] = mapped_column(String(36))
    array_index: Mapped[int | None] = mapped_column(Integer)
    # what keeps a pending job from the scheduling pass, like a hold: "dependency" until
    # its depends_on holds (dependencies.py), "array" until its array has a turn free
    # (max_running); None: the pass considers it
    blocked: Mapped[str | None] = mapped_column(String(20))
    # bumped by the database on every UPDATE of the row (migration 0020's trigger): the
    # scheduling leader re-reads only the jobs whose revision it has not seen (warm.py)
    rev: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # where the row last changed, set by the database (migration 0023): a pass reads only
    # the rows changed since its last read
    changed: Mapped[int] = mapped_column(BigInteger, server_default="0", index=True)


class ArrayRow(Base):
    """A job array: its elements are jobs with its id as `array_id`, one per index."""

    __tablename__ = "job_arrays"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), index=True)
    team: Mapped[str] = mapped_column(String(NAME), index=True)
    indexes: Mapped[str] = mapped_column(Text)          # as written compactly: 0-99
    size: Mapped[int] = mapped_column(Integer)
    max_running: Mapped[int | None] = mapped_column(Integer)
    # some elements wait for a turn (blocked "array"): each pass lets the next ones in as
    # others end; false once none waits, so a pass looks only at these arrays
    throttled: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    submitted_at: Mapped[datetime] = mapped_column(UtcDateTime)


class DependencyRow(Base):
    """One job a job (or every element of an array) waits for: `owner` is the waiting
    job's id or its array's id, `target` a job's id or an array's id. Open while the
    owner waits; each pass evaluates the open ones only (dependencies.py)."""

    __tablename__ = "job_dependencies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(36), index=True)
    kind: Mapped[str] = mapped_column(String(12))          # afterok | afterany | afternotok
    target: Mapped[str] = mapped_column(String(36), index=True)
    target_array: Mapped[bool] = mapped_column(Boolean, default=False)
    open: Mapped[bool] = mapped_column(Boolean, default=True, index=True)


class AllocationRow(Base):
    """One replica's grant, kept after release as history (`live` false)."""

    __tablename__ = "allocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    role: Mapped[str] = mapped_column(String(NAME))
    replica: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(ForeignKey("hosts.name"))
    gpus: Mapped[list[Any]] = mapped_column()
    cpus: Mapped[list[Any]] = mapped_column()
    memory_by_numa: Mapped[dict[str, Any]] = mapped_column()
    nics: Mapped[list[Any]] = mapped_column()
    # MIG devices held ([{gpu, index, profile, start, uuid, label}]); None: none
    mig: Mapped[list[Any] | None] = mapped_column(nullable=True)
    live: Mapped[bool] = mapped_column(Boolean, default=True, index=True)
    # when the grant began and ended: GPU-seconds granted, for accounting (indexed: a
    # report reads the grants that overlap its window, not every grant ever made)
    granted_at: Mapped[datetime | None] = mapped_column(UtcDateTime, index=True)
    released_at: Mapped[datetime | None] = mapped_column(UtcDateTime,
                                                         index=True)


class GpuHoldRow(Base):
    __tablename__ = "gpu_holds"
    host: Mapped[str] = mapped_column(ForeignKey("hosts.name"), primary_key=True)
    gpu: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)


class MigHoldRow(Base):
    """A MIG device held: (host, GPU, its position among the GPU's MIG devices)."""

    __tablename__ = "mig_holds"
    host: Mapped[str] = mapped_column(ForeignKey("hosts.name"), primary_key=True)
    gpu: Mapped[int] = mapped_column(Integer, primary_key=True)
    device: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)


class CpuHoldRow(Base):
    __tablename__ = "cpu_holds"
    host: Mapped[str] = mapped_column(ForeignKey("hosts.name"), primary_key=True)
    cpu: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)


class UsageRow(Base):
    """What one GPU did for one job's admission on one UTC day, integrated from the node
    agent's samples (trapezoids between consecutive samples). The `last_*` columns carry
    the previous sample to the next report; a new day starts a new row."""

    __tablename__ = "job_usage"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "host", "gpu", "day",
                                       name="uq_job_usage"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    team: Mapped[str] = mapped_column(String(NAME), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(NAME))
    replica: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(NAME))
    gpu: Mapped[int] = mapped_column(Integer)
    day: Mapped[str] = mapped_column(String(10), index=True)        # YYYY-MM-DD, UTC
    sampled_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    util_seconds: Mapped[float] = mapped_column(Float, default=0.0)   # percent x seconds
    util_peak: Mapped[float | None] = mapped_column(Float)
    memory_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    energy_joules: Mapped[float] = mapped_column(Float, default=0.0)
    zero_seconds: Mapped[float] = mapped_column(Float, default=0.0)  # at 0 % utilization
    below_since: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_util: Mapped[float | None] = mapped_column(Float)
    last_power: Mapped[float | None] = mapped_column(Float)
    last_energy: Mapped[float | None] = mapped_column(Float)


class SampleRow(Base):
    """A job's utilization on one host over time, at most one point per SERIES_STEP:
    what the UI plots. The job's totals come from job_usage, not from these."""

    __tablename__ = "job_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    host: Mapped[str] = mapped_column(String(NAME))
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    gpus: Mapped[int] = mapped_column(Integer)
    utilization_gpu: Mapped[float | None] = mapped_column(Float)     # mean, percent
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)  # sum
    power_watts: Mapped[float | None] = mapped_column(Float)          # sum


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)
    host: Mapped[str | None] = mapped_column(String(NAME))
    kind: Mapped[str] = mapped_column(String(40))
    message: Mapped[str] = mapped_column(Text)


class TokenRow(Base):
    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    team: Mapped[str] = mapped_column(String(NAME))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # "team", "admin" or "agent" (None: made before roles; then `admin` says which)
    role: Mapped[str | None] = mapped_column(String(16))
    hosts: Mapped[list[Any] | None]     # an agent token's host names or glob patterns
    # of these, the ones it may add to the cluster (None: only the cluster file's hosts)
    allow_new_hosts: Mapped[list[Any] | None]
    # refused from then on (None: never); the secret's last characters, which lists show
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    hint: Mapped[str | None] = mapped_column(String(16))
    user: Mapped[str | None] = mapped_column(String(NAME))   # a user's token of the team


class TeamRow(Base):
    """Admin-set shares and quotas; they override the policy file's `teams`."""

    __tablename__ = "teams"
    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    share: Mapped[float | None] = mapped_column(Float)
    quota_gpus: Mapped[int | None] = mapped_column(Integer)
    borrow_gpus: Mapped[int | None] = mapped_column(Integer)   # None: the policy file's


class ReservationRow(Base):
    """An admin's reservation of whole hosts for a window of time: for maintenance (no
    job starts there that would not end before it; the hosts drain at its start and
    resume at its end) or for teams (only their jobs that ask for it run there)."""

    __tablename__ = "reservations"
    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    hosts: Mapped[list[Any]] = mapped_column()
    start_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    end_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    teams: Mapped[list[Any]] = mapped_column(default=list)
    maint: Mapped[bool] = mapped_column(Boolean, default=False)
    gpus: Mapped[int | None] = mapped_column(Integer)          # asked as a GPU count
    gpu_model: Mapped[str | None] = mapped_column(String(NAME))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    created_by: Mapped[str] = mapped_column(String(NAME))
    # the hosts its start drained (resumed at its end): not those drained before it
    drained: Mapped[list[Any] | None] = mapped_column()


class DeletedReservationRow(Base):
    """A reservation deleted after its start, for `acct --by reservation`: what it held
    from its start to `end_at` (its deletion, or its end if that came first). Its name
    may be given to a new one; its jobs keep the name (JobRow.reservation)."""

    __tablename__ = "deleted_reservations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME))
    hosts: Mapped[list[Any]] = mapped_column()
    teams: Mapped[list[Any]] = mapped_column(default=list)
    maint: Mapped[bool] = mapped_column(Boolean, default=False)
    start_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    end_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    deleted_at: Mapped[datetime] = mapped_column(UtcDateTime)
    deleted_by: Mapped[str] = mapped_column(String(NAME))


class WebhookRow(Base):
    """A team's webhook, set by an admin: every job of the team is notified there of
    `events`; and the secret the team's notifications (its jobs' own too) are signed
    with, kept to sign and never shown again (service/notify.py)."""

    __tablename__ = "team_webhooks"
    team: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    url: Mapped[str | None] = mapped_column(String(URL))
    events: Mapped[list[Any] | None] = mapped_column()       # None: end, failure
    secret: Mapped[str | None] = mapped_column(String(100))
    secret_at: Mapped[datetime | None] = mapped_column(UtcDateTime)   # made or rotated


class LeaderLeaseRow(Base):
    """Who schedules a deployment (PostgreSQL): the leader renews `expires_at` (the
    database's clock) each round, and every pass's transaction first locks this row with
    the leader's `token`; a replica that takes over increments the token, so a leader that
    was frozen past its lease can never write again (service/leadership.py)."""

    __tablename__ = "leader_lease"
    deployment: Mapped[str] = mapped_column(String(300), primary_key=True)
    holder: Mapped[str] = mapped_column(String(NAME))        # its application_name
    pid: Mapped[int | None] = mapped_column(Integer)          # its lease backend's pid
    token: Mapped[int] = mapped_column(BigInteger)            # the fencing token
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)


class NotificationRow(Base):
    """One webhook delivery of one event (the outbox): written in the transaction that
    writes the event, POSTed by the leader's delivery thread in order per URL, marked
    delivered or given up (service/webhooks.py). `body` is the JSON sent, as signed."""

    __tablename__ = "notifications"
    # what the delivery thread polls: each URL's oldest pending delivery
    __table_args__ = (Index("ix_notifications_due", "state", "url", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(36), unique=True)
    event_id: Mapped[int | None] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)
    team: Mapped[str] = mapped_column(String(NAME))          # whose secret signs it
    url: Mapped[str] = mapped_column(String(URL))
    kind: Mapped[str] = mapped_column(String(20))            # start, end, failure, ...
    source: Mapped[str] = mapped_column(String(10))          # who asked: job | team | policy
    body: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(12))           # pending | delivered | given_up
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
