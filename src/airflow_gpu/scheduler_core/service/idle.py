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
keeps: a job is idle since the latest of its GPUs' marks, and only once every GPU it
holds has reported."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..store.models import GpuHoldRow, JobRow, UsageRow
from ..units import format_duration
from .common import _ts, _update, stop_options, stopping


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


def idle_since(s: Session, job_id: str, attempt: int) -> tuple[datetime | None, int]:
    """Since when every GPU the job holds is under the threshold (None: one is not, or
    has not reported), and how many GPUs it holds."""
    latest: dict[tuple, datetime | None] = {}
    for host, gpu, below in s.execute(
            select(UsageRow.host, UsageRow.gpu, UsageRow.below_since).where(
                UsageRow.job_id == job_id, UsageRow.attempt == attempt)
            .order_by(UsageRow.day.desc())):
        latest.setdefault((host, gpu), below)
    held = s.scalar(select(func.count()).select_from(GpuHoldRow).where(
        GpuHoldRow.job_id == job_id))
    if not held or len(latest) < held or any(b is None for b in latest.values()):
        return None, held
    return max(latest.values()), held


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


def evaluate(svc, s: Session, job_ids: list[str], now: datetime) -> None:

    for job in s.scalars(select(JobRow).where(JobRow.id.in_(job_ids),
                                              JobRow.state.in_(("admitted", "running")))):
        rule = rule_of(svc, job.spec)
        # the policy off for this job: nothing to keep (and no queries per report)
        since, gpus = (idle_since(s, job.id, job.attempt) if rule.after is not None
                       else (None, 0))
        if since is None:
            if job.idle_since is not None:
                if job.idle_flagged_at is not None:
                    svc._event(s, "idle", "uses its GPUs again: the idle flag is cleared",
                               job=job.id)
                job.idle_since = job.idle_flagged_at = None
            continue
        job.idle_since = since
        if job.idle_flagged_at is None:
            if _ts(now) - _ts(since) >= rule.after:
                job.idle_flagged_at = now
                svc._event(s, "idle", "idle: " + message(rule, since, gpus), job=job.id)
            continue
        if rule.action != "requeue" or _ts(now) - _ts(job.idle_flagged_at) < rule.grace:
            continue
        _, sig, grace = stop_options(svc.reg.job_classes, svc._policy(), job.spec, job.id)
        why = (f"idle: its GPUs stayed under {rule.threshold:g} % utilization for "
               f"{format_duration(_ts(now) - _ts(since))} (idle policy action: requeue)")
        done = s.execute(_update(JobRow).where(
            JobRow.id == job.id, JobRow.state.in_(("admitted", "running"))).values(
            **stopping(why, sig, grace, now)))
        if done.rowcount == 1:
            svc._event(s, "idle", f"stopping: {why}; sending {sig}, the job is requeued "
                       "under the same id once its replicas have stopped", job=job.id)
