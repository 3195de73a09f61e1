"""Preempted jobs in the store. The pass marks a victim `preempting` (it keeps its GPUs
and its lease); its launcher hears it on the next heartbeat, sends the job class's
signal, waits the grace, and finishes it as `preempted`: the job goes back to `pending`
under the same id and the preemptor starts on what it freed. A launcher that never
confirms is overruled once the grace and some slack have passed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..jobspec import JobSpec
from ..policy.guarantee import BROKEN
from ..policy.jobqueue import protect_delay
from ..policy.pending import Pending
from ..policy.preempt import Preemption
from ..policy.quota import spec_need
from ..store.models import JobRow
from .common import PENDING, SLACK, _same_attempt, _stale, _update, requeued, utcnow
from .errors import Conflict
from .idle import requeued_idle
from .jobcontrol import REQUEUED, name_jobs
from .overrun import OVERRAN, WINDOW
from .uow import Store


def mark_preempting(svc: Store, s: Session, p: Preemption) -> bool:
    """The victim starts stopping; False if it ended meanwhile (its GPUs are free)."""
    v = p.victim
    names = labels(s, [v.name, p.by.name])
    message = name_jobs(p.message, names)     # the engine names jobs by their ids
    done = s.execute(_update(JobRow).where(
        JobRow.id == v.name, JobRow.state.in_(("admitted", "running"))).values(
        state="preempting", preempted_by=p.by.name, preempt_reason=message,
        preempt_deadline_at=datetime.fromtimestamp(p.stop_at + SLACK, UTC),
        preemptors=sorted(v.preempted_by | {p.by.name}),
        preempt_signal=v.preempt_signal, preempt_grace=round(v.preempt_grace),
        preemptions=JobRow.preemptions + 1))
    if done.rowcount != 1:
        return False
    svc._event(s, "preempted", message, job=v.name)
    svc._event(s, "preempting", f"preempts job {names[v.name]} ({p.reason}, team {v.team}, "
               f"band {v.base:g}, {v.gpus} GPUs); it starts once that job has stopped"
               + (f"; {name_jobs(p.broken, names)}" if p.broken else ""), job=p.by.name)
    return True


def labels(s: Session, ids: list[str]) -> dict[str, str]:
    """{id: "name (short id)"} of these jobs (an element's name with its index), as
    messages name jobs; an id not found names itself by its short id."""
    found = {r.id: r for r in s.execute(select(JobRow.id, JobRow.name, JobRow.array_index)
                                         .where(JobRow.id.in_(ids)))}
    out = {}
    for i in ids:
        r = found.get(i)
        name = None if r is None else r.name if r.array_index is None else \
            f"{r.name}_{r.array_index}"
        out[i] = f"{name} ({i[:8]})" if name else i[:8]
    return out


def broken_guarantee(row: JobRow, why: Pending) -> Pending:
    """A job requeued by a reclaim that took its team below its guarantee says so, with
    whether it fits on what was left, while it waits (guarantee.py)."""
    text = row.preempt_reason or ""
    at = text.find(BROKEN)
    if row.requeue_reason != "preempted" or at < 0:
        return why
    end = text.find("); ", at)
    why.message += f"; preempted by job {row.preempted_by}, {text[at:end if end > 0 else None]}"
    why.details["guarantee_broken_by"] = row.preempted_by
    return why


def requeue(svc: Store, s: Session, job_id: str, *where, forced: bool = False) -> bool:
    """A preempting job back to the queue under the same id, its resources released."""
    row = s.execute(select(JobRow.preempted_by, JobRow.attempt, JobRow.preempt_reason,
                           JobRow.limit_cut_by).where(JobRow.id == job_id)).first()
    # no preemptor: `airflow-gpu requeue` (jobcontrol.py) or the idle-GPU policy (idle.py)
    text = row.preempt_reason or ""
    asked, overran = text.startswith(REQUEUED), text.startswith(OVERRAN)
    window = text.startswith((WINDOW, "maintenance " + WINDOW))
    reason = ("preempted" if row.preempted_by else "requeued" if asked else
              "overrun" if overran else "reservation" if window else "idle")
    more = behind_reserved(svc, s, job_id, row.limit_cut_by) if overran else {}
    done = s.execute(_update(JobRow).where(
        JobRow.id == job_id, JobRow.state == "preempting", *where).values(
        **requeued(reason, **more)))
    if done.rowcount != 1:
        return False
    svc._release(s, job_id)
    how = (f"its launcher did not confirm the stop within its grace (+{SLACK:g}s)"
           if forced else "its launcher stopped the replicas")
    who = (f"preempted by job {labels(s, [row.preempted_by])[row.preempted_by]}"
           if row.preempted_by else
           text.split(" (")[0] if asked else
           text if overran or window else "idle GPUs")
    more, held = requeued_idle(svc, s, job_id, utcnow()) if reason == "idle" else ("", None)
    svc._event(s, "requeued", f"{who}: {how}; back in the queue under the same id "
               f"(admission {row.attempt} ended){more}", job=job_id)
    if held:
        svc._event(s, "held", held, job=job_id)
    return True


def behind_reserved(svc: Store, s: Session, job_id: str, reserved: str | None) -> dict:
    """An overrunner goes back to the queue due for protection after the job it yielded
    to and every protected job (pending with a promise): with its own age it could be
    protected first and take back the resources their promises count on (as the
    engine's Scheduler.requeue). Due = queued + a delay that grows with the job's share
    of the cluster's GPUs (jobqueue.protect_delay)."""
    policy, total = svc._policy(), svc.cluster.total_gpus

    def delay(spec: dict, row_id: str) -> float:
        try:
            charge = spec_need(JobSpec.model_validate({**spec, "name": row_id}))[0]
        except (ValueError, TypeError):
            charge = 0
        return protect_delay(policy.protect_span, charge, total)

    own = s.execute(select(JobRow.queued_at, JobRow.submitted_at, JobRow.spec)
                    .where(JobRow.id == job_id)).first()
    ahead = s.execute(select(JobRow.id, JobRow.queued_at, JobRow.submitted_at, JobRow.spec)
                      .where(JobRow.state == PENDING, JobRow.id != job_id,
                             (JobRow.id == (reserved or "")) |
                             JobRow.promised_at.is_not(None))).all()
    if not ahead:
        return {}
    due = max((r.queued_at or r.submitted_at) + timedelta(seconds=delay(r.spec, r.id))
              for r in ahead)
    queued = due - timedelta(seconds=delay(own.spec, job_id)) + timedelta(milliseconds=1)
    return {"queued_at": queued} if queued > (own.queued_at or own.submitted_at) else {}


def stopped(svc: Store, job_id: str, attempt: int | None) -> JobRow:
    """The launcher of a preempted job has stopped its replicas (finish: preempted)."""
    with svc.sessions.begin() as s:
        if not requeue(svc, s, job_id, *_same_attempt(attempt)):
            current = s.get(JobRow, job_id)
            if current.state == PENDING and current.requeue_reason in (
                    "preempted", "idle", "requeued", "overrun"):
                return current          # said twice, or requeued by force before
            raise Conflict(_stale(current, attempt, "only a job that is preempting can be "
                                  "finished as preempted"))
    svc.wake.set(freed=True)
    return svc.get(job_id)


def requeue_overdue(svc: Store, s: Session, now: datetime) -> None:
    """Requeue the preempting jobs whose launcher did not confirm the stop in time (in the
    lease check's fenced transaction `s`)."""
    for job_id in list(s.scalars(select(JobRow.id).where(
            JobRow.state == "preempting", JobRow.preempt_deadline_at < now))):
        if requeue(svc, s, job_id, JobRow.preempt_deadline_at < now, forced=True):
            svc.wake.set(freed=True)
