"""The idle-GPU policy: a live job whose GPUs all stay below the threshold for `after`
seconds is flagged (the job's `idle_flagged_at`, an `idle` event, the task log, the UI,
the `airflow_gpu_idle_jobs` gauge); with action `requeue`, a job still idle `grace`
seconds after the flag is stopped like a preempted one (its class's signal and grace)
and requeued under the same id. A job that uses its GPUs again loses the flag.

A job requeued as idle goes to the back of its priority band (`queue_entry`): it would
otherwise be the best pending job again and be re-admitted onto the GPUs it just left
idle, freeing nothing. At its `hold_after`-th idle requeue it is held (JobHeldUser:
its team or an admin releases it) instead of looping every `after + grace`.

Evaluated on every node agent report, from the per-GPU `below_since` marks accounting
keeps (the usage rows the report read already): a job is idle since the latest of its
GPUs' marks, and only once every GPU it holds has reported."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.orm import Session

from ..store.models import JobRow
from ..units import format_duration
from .common import _ts, _update, stop_options, stopping

if TYPE_CHECKING:
    from .accounting import Attributed, Held

WATCHED = ("admitted", "running")    # the jobs the policy flags and stops


@dataclass(frozen=True)
class IdleRule:
    after: float | None       # seconds; None: never flagged
    threshold: float          # percent
    action: str               # notify | requeue
    grace: float              # seconds from the flag to the action


def rule_of(svc, spec: dict) -> IdleRule:
    """The job's class's idle settings over the policy's."""
    p = svc._policy().idle
    jc = svc.reg.job_classes.get((spec or {}).get("job_class") or "")
    after = p.after
    if jc is not None and jc.idle_after is not None:
        after = jc.idle_after or None            # 0: the class's jobs are never flagged
    threshold = jc.idle_threshold if jc is not None and jc.idle_threshold is not None \
        else p.threshold
    action = jc.idle_action if jc is not None and jc.idle_action else p.action
    return IdleRule(after, threshold, action, p.grace)


def threshold_of(svc, spec: dict) -> float:
    return rule_of(svc, spec).threshold


def idle_since(job: Held) -> tuple[datetime | None, int]:
    """Since when every GPU the job holds is under the threshold (None: one is not, or
    has not reported), and how many GPUs it holds; from the newest usage rows the report
    read (accounting.record)."""
    marks = [r.below_since for r in job.rows.values()]
    if not job.held or len(marks) < job.held or any(b is None for b in marks):
        return None, job.held
    return max(marks), job.held


def queue_entry(row: JobRow) -> tuple[float, bool]:
    """Where a pending job queues: its submit time as the queue sees it (its last idle
    requeue, if any) and whether it is behind its band's other jobs (requeued as idle
    and not admitted since)."""
    behind = row.requeue_reason == "idle" and row.queued_at is not None
    return _ts(row.queued_at or row.submitted_at), behind


def requeued_idle(svc, s: Session, job_id: str, now: datetime) -> tuple[str, str | None]:
    """After an idle requeue (preemption.requeue): count it, queue the job behind its
    band, and hold it at the policy's `hold_after`-th. Returns what the requeue event
    adds, and the hold's reason (None: not held) for the event that follows it."""
    count = (s.scalar(select(JobRow.idle_requeues).where(JobRow.id == job_id)) or 0) + 1
    limit = svc._policy().idle.hold_after
    values: dict = {"idle_requeues": count, "queued_at": now}
    if limit is None or count < limit:
        s.execute(_update(JobRow).where(JobRow.id == job_id).values(**values))
        left = "" if limit is None else (f" (idle requeue {count}; it is held at idle "
                                          f"requeue {limit}: idle policy hold_after)")
        return ("; it waits behind the other jobs of its band, so the GPUs it left idle go "
                "to the work that was waiting" + left), None
    reason = (f"held by the idle-GPU policy: requeued {count} times because its GPUs sat "
              f"idle (idle policy hold_after: {limit}); it is not started until released "
              f"(airflow-gpu release {job_id[:8]}, by its team or an admin)")
    s.execute(_update(JobRow).where(JobRow.id == job_id).values(
        **values, reason_code="JobHeldUser", reason=reason, eta_at=None, promised_at=None,
        details={"hold": "idle", "hold_by": "idle policy", "hold_at": now.isoformat(),
                 "idle_requeues": count}))
    return f"; held: idle requeue {count} of {limit} (idle policy hold_after)", reason


def message(rule: IdleRule, since: datetime, gpus: int) -> str:
    what = (f"its {gpus} GPU{'s' if gpus != 1 else ''} have stayed under "
            f"{rule.threshold:g} % utilization since {since:%Y-%m-%d %H:%M:%S} UTC "
            f"(idle policy: flag after {format_duration(rule.after)})")
    if rule.action == "requeue":
        return (what + f"; unless it uses them within {format_duration(rule.grace)} it is "
                "stopped and requeued under the same id")
    return what + "; release them if the work is done (action: notify)"


# the flag's columns, written for every changed job at once (a stopped job's too,
# before its stop: hence the state guard, which keeps a requeued job's cleared flag)
_JOBS = JobRow.__table__
_SET_FLAG = update(_JOBS).where(_JOBS.c.id == bindparam("b_id"),     # no IN: executemany
                                or_(*(_JOBS.c.state == w for w in WATCHED)))


def evaluate(svc, s: Session, seen: Attributed, now: datetime) -> bool:
    """The policy over the jobs a report gave GPUs of: flags set and cleared in one
    statement; events, and stops, only for the jobs whose flag or state changes. Returns
    whether it stopped a job."""
    changed: list[dict] = []
    # (job, message) events, (job, message, rule) flags and (job, rule, since) stops
    acts: list[tuple] = []
    for job_id in seen.reported:
        job = seen.jobs[job_id]
        if job.state not in WATCHED:
            continue
        rule = seen.rules[job_id]
        was = (job.idle_since, job.idle_flagged_at)
        # the policy off for this job: nothing to keep
        since, gpus = idle_since(job) if rule.after is not None else (None, 0)
        if since is None:
            if job.idle_since is not None:
                if job.idle_flagged_at is not None:
                    acts.append((job, "uses its GPUs again: the idle flag is cleared"))
                job.idle_since = job.idle_flagged_at = None
        else:
            job.idle_since = since
            if job.idle_flagged_at is None:
                if _ts(now) - _ts(since) >= rule.after:
                    job.idle_flagged_at = now
                    acts.append((job, "idle: " + message(rule, since, gpus), rule))
            elif rule.action == "requeue" and _ts(now) - _ts(job.idle_flagged_at) >= rule.grace:
                acts.append((job, rule, since))
        if (job.idle_since, job.idle_flagged_at) != was:
            changed.append({"b_id": job.id, "idle_since": job.idle_since,
                            "idle_flagged_at": job.idle_flagged_at})
    if changed:
        s.connection().execute(_SET_FLAG, changed)
    stopped = False
    for job, *act in acts:
        if len(act) == 1:
            svc._event(s, "idle", act[0], job=job.id)
        elif isinstance(act[0], str):
            # the flag: told to the job's webhooks that asked for `idle`; with action
            # notify (the policy's way to tell) to all of them
            svc._event(s, "idle", act[0], job=job.id, notify=("idle",),
                       always=act[1].action == "notify")
        else:
            stopped = _stop(svc, s, job, *act, now) or stopped
    return stopped


def _stop(svc, s: Session, job: Held, rule: IdleRule, since: datetime,
          now: datetime) -> bool:
    """Stop an idle job like a preempted one (action requeue): its class's signal and
    grace, then the requeue under the same id."""
    spec = s.scalar(select(JobRow.spec).where(JobRow.id == job.id))
    _, sig, grace = stop_options(svc.reg.job_classes, svc._policy(), spec, job.id)
    why = (f"idle: its GPUs stayed under {rule.threshold:g} % utilization for "
           f"{format_duration(_ts(now) - _ts(since))} (idle policy action: requeue)")
    done = s.execute(_update(JobRow).where(
        JobRow.id == job.id, JobRow.state.in_(WATCHED)).values(
        **stopping(why, sig, grace, now)))
    if done.rowcount != 1:
        return False
    svc._event(s, "idle", f"stopping: {why}; sending {sig}, the job is requeued "
               "under the same id once its replicas have stopped", job=job.id,
               notify=("preemption",))
    return True
