"""What every module of the service shares: the job states, the caller (`Principal`),
times, guarded updates, events and releases, and the spec helpers submits use."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError
from sqlalchemy import and_, delete, inspect, or_, update
from sqlalchemy.orm import Session

from ..engine.mig import gpu_share
from ..jobclasses import STOP_SLACK
from ..jobspec import JobSpec
from ..store.models import AllocationRow, CpuHoldRow, EventRow, GpuHoldRow, JobRow, MigHoldRow
from .errors import Conflict

PENDING = "pending"
UTILIZATION = ("utilization_gpu", "utilization_memory", "memory_used_bytes", "power_watts",
               "temperature_c", "uuid", "energy_joules", "sm_active", "thermal_throttle")
# live: holding resources; `preempting`: being stopped for another job (it keeps them
# until its launcher says it has stopped, or its preempt deadline passes)
LIVE = ("admitted", "running", "preempting")
# `rev` set to this keeps a job row's revision (migration 0021): for writes of what the
# scheduling leader does not read (a heartbeat's lease), so it does not read the row again
QUIET = -1
ENDED = ("succeeded", "failed", "cancelled", "lost", "timeout")
SLACK = STOP_SLACK    # seconds past a victim's grace before it is requeued by force
# what keeps a pending job from the pass (JobRow.blocked), with the reason code it shows
WAIT_DEPENDENCY, WAIT_ARRAY = "dependency", "array"
WAIT_CODES = {WAIT_DEPENDENCY: "Dependency", WAIT_ARRAY: "JobArrayTaskLimit"}
CHUNK = 500           # ids per IN (...) of the statements that touch many jobs
HELD = ("JobHeldUser", "JobHeldAdmin")     # Slurm's reason codes of held jobs


def not_held():
    """SQL: the job is not held (the pass's writes to pending jobs are guarded by it).
    No IN list: SQLite runs a bulk update (store/bulk.py) as executemany, which takes
    none."""
    return or_(JobRow.reason_code.is_(None), and_(*(JobRow.reason_code != h for h in HELD)))


def schedulable():
    """SQL: a pending job the pass considers: neither held nor blocked (waiting for a
    dependency or its array's turn)."""
    return and_(not_held(), JobRow.blocked.is_(None))


def is_held(row: JobRow) -> bool:
    return row.state == PENDING and row.reason_code in HELD


@dataclass(frozen=True)
class Principal:
    team: str
    admin: bool = False
    user: str | None = None          # a user's token: its jobs are that user's

    def may_act_for(self, team: str) -> bool:
        return self.admin or self.team == team

    def may_change(self, team: str, user: str | None) -> bool:
        """May cancel, hold, update, heartbeat... a job of `team` whose user is `user`: an
        admin any; a team's token any of its team's; a user's token only that user's
        (rights.py)."""
        return self.may_act_for(team) and (self.admin or self.user is None
                                           or self.user == user)

    @property
    def who(self) -> str:
        """How events name the caller: `team vision`, `user alice of team vision`."""
        return f"user {self.user} of team {self.team}" if self.user else f"team {self.team}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def _ts(dt: datetime) -> float:
    if dt.tzinfo is None:          # SQLite gives naive datetimes back: they were UTC
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _update(table):
    """An UPDATE that does not walk the session's objects (a pass holds thousands)."""
    return update(table).execution_options(synchronize_session=False)


def eta_seconds(row: JobRow, now: float | None = None) -> int | None:
    """Whole seconds until the planned start (kept as a time, so it needs no rewrites)."""
    if row.eta_at is None:
        return None
    return max(0, round(row.eta_at - (time.time() if now is None else now)))


def _columns(row) -> dict:
    return {c.key: getattr(row, c.key) for c in inspect(type(row)).column_attrs}


def _same_attempt(attempt: int | None) -> tuple:
    return () if attempt is None else (JobRow.attempt == attempt,)


def _stale(row: JobRow, attempt: int | None, rule: str) -> str:
    if attempt is not None and row.state in LIVE and row.attempt != attempt:
        return (f"job {row.id} was requeued and admitted again (admission {row.attempt}); "
                f"this launcher started admission {attempt}: stop it and launch the new "
                "placement")
    return f"job {row.id} is {row.state}; {rule}"


def requeued(reason: str, **more) -> dict:
    """The columns of a job sent back to the queue under the same id."""
    return dict(state=PENDING, admitted_at=None, started_at=None, lease_expires_at=None,
                reason_code=None, reason=None, details={}, eta_at=None, promised_at=None,
                deadline_at=None, limit_cut_by=None, yield_at=None, preempt_deadline_at=None,
                borrowed=False, requeue_reason=reason, idle_since=None, idle_flagged_at=None,
                **more)


def stop_options(job_classes, policy, spec: dict, job_id: str
                 ) -> tuple[JobSpec | None, str, float]:
    """A stored job's spec, and the signal and grace its job class stops it with (the
    requeues that no job asks for: `airflow-gpu requeue`, the idle policy, an overrun);
    no spec, SIGTERM and the policy's stop_grace where the stored spec no longer reads."""
    from ..jobclasses import preempt_options, stop_grace

    try:
        parsed = JobSpec.model_validate({**spec, "name": job_id})
    except (ValueError, TypeError):
        return None, "SIGTERM", float(policy.stop_grace)
    grace = stop_grace(parsed, job_classes, policy.defaults)
    _, sig, grace, _ = preempt_options(job_classes.get(parsed.job_class or ""), grace)
    return parsed, sig, grace


def stopping(why: str, sig: str, grace: float, now: datetime) -> dict:
    """The columns of a live job told to stop with no preemptor (those requeues): its
    launcher sends `sig`, SIGKILL `grace` seconds later, and SLACK seconds after that it
    is requeued by force."""
    return dict(state="preempting", preempted_by=None, preempt_reason=why,
                preempt_deadline_at=datetime.fromtimestamp(_ts(now) + grace + SLACK, UTC),
                preempt_signal=sig, preempt_grace=round(grace))


def spec_gpus(spec: dict) -> float:
    """GPUs a stored spec is charged (whole GPUs plus MIG shares, quota.charged_gpus); 0
    for one it cannot read (an ended job's bad spec must not stop every pass while its
    usage counts in fair share)."""
    try:
        total = 0.0
        for r in spec.get("roles", []):
            mig = (r.get("gpu") or {}).get("mig")
            if isinstance(mig, str):
                mig = {"profile": mig}
            share = float(gpu_share(mig["profile"]) * mig.get("count", 1)) if mig else 0.0
            total += (int(r.get("gpus", 0)) + share) * r.get("replicas", 1)
        return total
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def spec_digest(spec: JobSpec) -> str:
    """SHA-256 of a spec with every default filled in: specs meaning the same job (a field
    left out or given its default, keys in another order) have the same digest."""
    normal = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(normal.encode()).hexdigest()


def _stored_digest(row: JobRow) -> str | None:
    """The digest of a job's spec as submitted; for a job stored before 0009, of its spec
    now (None if it no longer validates)."""
    if row.spec_digest:
        return row.spec_digest
    try:
        return spec_digest(JobSpec.model_validate(row.spec))
    except (ValidationError, TypeError, ValueError):
        return None


def same_job(found: JobRow, row: JobRow) -> None:
    """`row` reuses the idempotency key of `found`, which the store holds: fine for the
    same spec (a retry), a Conflict for another one."""
    if _stored_digest(found) != row.spec_digest:
        raise Conflict(f"idempotency_key {row.idempotency_key!r} was used for job "
                       f"{found.id} with another spec; use a new key")


# what each job event kind notifies of (a job's or team's `events`), the most specific
# first: a failed job's webhook that asked for failure and end gets one "failure".
# Preemption: the job is told to stop and will be requeued (by a preemptor, `airflow-gpu
# requeue`, a reservation it backfilled ahead of, or the idle policy: idle.py says so)
TOPICS = {"admitted": ("start",), "running": ("start",), "succeeded": ("end",),
          "cancelled": ("end",), "failed": ("failure", "end"), "timeout": ("failure", "end"),
          "lost": ("failure", "end"), "preempted": ("preemption",),
          "requeue": ("preemption",), "overrun": ("preemption",), "requeued": ("requeue",),
          "reservation": ("reservation",), "deadline": ("deadline",)}
OUTBOX = "airflow_gpu.notify"     # session.info: the events the commit notifies (notify.py)


def event(s: Session, kind: str, message: str, job: str | None = None,
          host: str | None = None, notify: tuple[str, ...] | None = None,
          always: bool = False) -> None:
    """One event, in the transaction of the change it tells. A job's event also goes to
    the webhooks that asked for what it is (`notify`, default TOPICS by kind; `always`:
    to the job's webhooks whatever they asked for, as `idle.action: notify` does): the
    outbox rows are written in the same transaction, as it commits (notify.py)."""
    row = EventRow(at=utcnow(), job_id=job, host=host, kind=kind, message=message)
    s.add(row)
    topics = TOPICS.get(kind, ()) if notify is None else notify
    if job is not None and topics:
        s.info.setdefault(OUTBOX, []).append((row, topics, always))


def release(s: Session, job_id: str) -> None:
    """Free everything a job holds and close its live allocations."""
    release_many(s, [job_id])


def release_many(s: Session, job_ids: list[str]) -> None:
    """release() for many jobs, a few statements per CHUNK of them."""
    now = utcnow()
    for i in range(0, len(job_ids), CHUNK):
        ids = job_ids[i:i + CHUNK]
        for hold in (GpuHoldRow, MigHoldRow, CpuHoldRow):
            s.execute(delete(hold).where(hold.job_id.in_(ids))    # no walk of the session's
                      .execution_options(synchronize_session=False))   # objects
        s.execute(_update(AllocationRow).where(AllocationRow.job_id.in_(ids),
                                               AllocationRow.live.is_(True))
                  .values(live=False, released_at=now))
