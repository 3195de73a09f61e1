"""Slurm's and Grid Engine's job control on the store (job references: references.py):
hold and release (scontrol hold/release, qhold, qrls), update (scontrol update, qalter:
priority, time limit) and requeue (scontrol requeue).

A hold lives in the pending job's reason columns (`reason_code` JobHeldUser or
JobHeldAdmin, `details.hold`): the pass never submits a held job to the scheduler and its
writes are guarded so that a hold committed during a pass is never overwritten or
admitted (storepass.py). A requeue stops the job like a preemption (state `preempting`,
its class's signal and grace; the launcher finishes it as `preempted`) and puts it back
in the queue under the same id (preemption.requeue)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import ValidationError
from sqlalchemy import select

from ..errors import InputError, describe_validation_error
from ..jobclasses import resolve
from ..jobspec import JobSpec
from ..store.models import ArrayRow, JobRow
from ..units import format_duration, parse_duration
from . import arrays, dependencies
from .common import (
    HELD,
    LIVE,
    PENDING,
    WAIT_ARRAY,
    WAIT_DEPENDENCY,
    Principal,
    _ts,
    _update,
    is_held,
    stop_options,
    stopping,
    utcnow,
)
from .errors import Conflict, Forbidden
from .reservation_jobs import limit_refusal
from .rights import by
from .uow import Store

REQUEUED = "requeued by "                  # preempt_reason of a requeue (preemption.py)


def names_of(svc: Store, ids) -> dict[str, JobRow]:
    """The jobs of these ids (blockers named in reasons), in one query."""
    ids = [i for i in dict.fromkeys(ids) if isinstance(i, str)]
    if not ids:
        return {}
    with svc.reads() as s:
        return {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}


def blocker_ids(details: dict) -> list[str]:
    """The jobs a pending reason's details name: GPU holders, the job whose reservation
    it would delay, the victims it preempts, the fifo head it waits behind, the team's job
    whose end frees its quota."""
    out = []
    for key in ("held_by", "mig_held_by"):     # GPUs, MIG devices
        if isinstance(details.get(key), dict):
            out += details[key]
    for key in ("reservation_for", "behind", "quota_frees_with"):
        if isinstance(details.get(key), str):
            out.append(details[key])
    # the victims it preempts; the jobs its dependencies wait for (dependencies.py)
    for key in ("victims", "waits_for"):
        out += [v for v in details.get(key) or () if isinstance(v, str)]
    return list(dict.fromkeys(out))


def blockers(svc: Store, row: JobRow) -> tuple[list[dict], dict[str, str]]:
    """([{id, name, team, state}], {id: "name (id8)"}) of the jobs the reason names."""
    ids = blocker_ids(row.details or {}) if row.state == PENDING else []
    if row.state == PENDING and row.reason_code in HELD:
        ids = []
    rows = names_of(svc, ids)
    out = [{"id": i, "name": rows[i].name, "team": rows[i].team, "state": rows[i].state}
           if i in rows else {"id": i, "name": None, "team": None, "state": None}
           for i in ids]
    return out, {i: f"{r.name} ({i[:8]})" for i, r in rows.items()}


def name_jobs(text: str | None, names: dict[str, str]) -> str | None:
    """A reason with each job id replaced by the job's name and short id."""
    if not text:
        return text
    for job_id, label in names.items():
        text = text.replace(f"'{job_id}'", label).replace(job_id, label)
    return text


def name_blockers(svc: Store, outs: list) -> list:
    """Jobs as the API gives them, each pending reason naming the jobs it waits for by
    name and short id ("held by big (3f5db580) (8)"), as queue and explain do; the
    details keep their ids. One query for all of them."""
    pend = [o.pending for o in outs if o.pending is not None and o.pending.reason
            and o.pending.code not in HELD]
    rows = names_of(svc, [i for p in pend for i in blocker_ids(p.details or {})])
    names = {i: f"{r.name} ({i[:8]})" for i, r in rows.items()}
    for p in pend if names else ():
        p.reason = name_jobs(p.reason, names)
    return outs


# -- hold and release -----------------------------------------------------------------------
def hold(svc: Store, job_id: str, who: Principal) -> JobRow:
    """A pending job is held: it is never started until released. An admin's hold
    (JobHeldAdmin) can only be released by an admin; a team's is JobHeldUser."""
    row = svc._owned(job_id, who)
    code = "JobHeldAdmin" if who.admin else "JobHeldUser"
    if row.state != PENDING:
        raise Conflict(f"job {_named(row)} is {row.state}; only a pending job can be held "
                       "(requeue a running one first: airflow-gpu requeue)")
    if row.reason_code in HELD and (row.reason_code == code or not who.admin):
        return row                        # holding again is harmless (an admin's stays)
    kind = "admin" if who.admin else "user"
    reason = (f"held by {by(who)}: it is not started until released (airflow-gpu release "
              f"{job_id[:8]})")
    with svc.sessions.begin() as s:
        done = s.execute(_update(JobRow).where(JobRow.id == job_id,
                                               JobRow.state == PENDING).values(
            reason_code=code, reason=reason,
            details={"hold": kind, "hold_by": who.team, "hold_at": utcnow().isoformat()},
            eta_at=None, promised_at=None))
        if done.rowcount != 1:
            raise Conflict(f"job {_named(row)} is {s.get(JobRow, job_id).state}; only a "
                           "pending job can be held")
        svc._event(s, "held", reason, job=job_id)
    svc.wake.set()
    return svc.get(job_id)


def release(svc: Store, job_id: str, who: Principal) -> JobRow:
    row = svc._owned(job_id, who)
    if not is_held(row):
        if row.state == PENDING:
            return row                    # not held: nothing to release
        raise Conflict(f"job {_named(row)} is {row.state}; only a held pending job can be "
                       "released")
    if row.reason_code == "JobHeldAdmin" and not who.admin:
        raise Forbidden(f"job {_named(row)} is held by an admin (JobHeldAdmin, "
                        f"{(row.details or {}).get('hold_by')}); only an admin releases it")
    with svc.sessions.begin() as s:
        done = s.execute(_update(JobRow).where(
            JobRow.id == job_id, JobRow.state == PENDING,
            JobRow.reason_code == row.reason_code).values(
            eta_at=None, promised_at=None, **_waiting(s, row)))
        if done.rowcount == 1:
            svc._event(s, "released", f"released by {by(who)}: it is scheduled again",
                       job=job_id)
    svc.wake.set()
    return svc.get(job_id)


def _waiting(s, row: JobRow) -> dict:
    """The reason columns of a job whose hold ends: none, or what it still waits for
    (its dependencies, its array's turn) as those show it."""
    if row.blocked == WAIT_DEPENDENCY:
        return dependencies.reason_for(s, row)
    if row.blocked == WAIT_ARRAY:
        return {"reason_code": arrays.CODE, "details": {},
                "reason": arrays.wait_reason(s.get(ArrayRow, row.array_id))}
    return {"reason_code": None, "reason": None, "details": {}}


# -- update ---------------------------------------------------------------------------------
def update(svc: Store, job_id: str, who: Principal, priority: int | None = None,
           time_limit: int | str | None = None) -> JobRow:
    """Change a job's priority (pending jobs) or time limit. The new spec goes through
    the same checks as at submit (the job class's and the policy's maximum time limit:
    jobclasses.resolve). A live job's limit may be lowered by its team and raised by an
    admin (a backfilled job's yield to a reservation stays where it was: overrun.py)."""
    row = svc._owned(job_id, who)
    values, guard, changes = plan_update(svc, row, who, priority, time_limit)
    with svc.sessions.begin() as s:
        done = s.execute(_update(JobRow).where(JobRow.id == job_id, *guard).values(**values))
        if done.rowcount != 1:
            raise Conflict(f"job {_named(row)} changed meanwhile (it is "
                           f"{s.get(JobRow, job_id).state}); look again and retry")
        svc._event(s, "updated", f"updated by {by(who)}: " + ", ".join(changes),
                   job=job_id)
    svc.wake.set()
    return svc.get(job_id)


def _named(row: JobRow) -> str:
    """A job as messages name it: its short id and name (an element's with its index)."""
    name = row.name if row.array_index is None else f"{row.name}_{row.array_index}"
    return f"{row.id[:8]} ({name})"


def plan_update(svc: Store, row: JobRow, who: Principal, priority: int | None,
                time_limit: int | str | None) -> tuple[dict, list, list[str]]:
    """What an update of `row` writes (values), the guard of its UPDATE and the changes
    its event tells; InputError, Conflict or Forbidden when it may not be made (an
    array's update plans each kind of element with it: bulkcontrol.py)."""
    job = _named(row)
    if priority is None and time_limit is None:
        raise InputError("update: give --priority and/or --time-limit")
    if row.state not in (PENDING, *LIVE):
        raise Conflict(f"job {job} is {row.state}; only pending or live jobs can be "
                       "updated")
    if priority is not None and row.state != PENDING:
        raise Conflict(f"job {job} is {row.state}: priority orders pending jobs only; "
                       "a live job's time limit may still be changed")
    raw = dict(row.spec)
    changes = []
    if priority is not None:
        raw["priority"] = priority
        changes.append(f"priority {row.priority} -> {priority}")
    limit = None
    if time_limit is not None:
        try:
            limit = parse_duration(time_limit)
        except (TypeError, ValueError) as exc:
            raise InputError(f"time_limit: {exc}") from None
        if not limit or limit <= 0:
            raise InputError("time_limit: must be more than 0 (e.g. 2h)")
        raw["time_limit"] = format_duration(limit)
        expected = raw.get("expected_runtime")
        if expected is not None and parse_duration(expected) > limit:
            raw["expected_runtime"] = format_duration(limit)   # it cannot run longer
    try:
        spec = JobSpec.model_validate({**raw, "name": row.name})
    except ValidationError as exc:
        raise InputError(describe_validation_error(exc, JobSpec)) from None
    resolved = resolve(spec, svc.reg.job_classes, defaults=svc._policy().defaults)
    if limit is not None:           # inside a reservation: never past its end
        why = limit_refusal(svc, row, resolved)
        if why:
            raise InputError(why)
    values: dict = {"spec": {**spec.model_dump(mode="json", exclude_unset=True),
                             "team": row.team, "name": row.name}}
    if priority is not None:
        values["priority"] = priority
    guard = [JobRow.state == row.state]
    if limit is not None:
        old = _limit_of(row)
        changes.append(f"time limit {format_duration(old) if old else 'none'} -> "
                       f"{format_duration(resolved.time_limit)}")
        if row.state in LIVE:
            if old is not None and limit > old and not who.admin:
                raise Forbidden(f"job {job} is {row.state}: only an admin may raise a "
                                "running job's time limit (its team may lower it)")
            values["deadline_at"] = datetime.fromtimestamp(
                _ts(row.admitted_at) + resolved.time_limit, UTC)
            guard.append(JobRow.attempt == row.attempt)
    return values, guard, changes


def _limit_of(row: JobRow) -> int | None:
    """The job's time limit now: as admitted for a live job, else as asked."""
    if row.state in LIVE and row.deadline_at is not None and row.admitted_at is not None:
        return round(_ts(row.deadline_at) - _ts(row.admitted_at))
    raw = (row.spec or {}).get("time_limit")
    return parse_duration(raw) if raw is not None else None


# -- requeue --------------------------------------------------------------------------------
def requeue(svc: Store, job_id: str, who: Principal) -> JobRow:
    """Stop a live job like a preempted one (its class's signal and grace) and put it back
    in the queue under the same id once its launcher has stopped the replicas (or the
    grace has passed). Its submit time and place in the queue stay."""

    row = svc._owned(job_id, who)
    if row.state == "preempting":
        return row                        # already stopping
    if row.state not in ("admitted", "running"):
        raise Conflict(f"job {_named(row)} is {row.state}; only an admitted or running "
                       "job can be requeued")
    _, sig, grace = stop_options(svc.reg.job_classes, svc._policy(), row.spec, row.id)
    now = utcnow()
    why = (f"{REQUEUED}{by(who)} (airflow-gpu requeue): sending {sig}, SIGKILL after "
           f"{format_duration(grace)}")
    with svc.sessions.begin() as s:
        done = s.execute(_update(JobRow).where(
            JobRow.id == job_id, JobRow.state.in_(("admitted", "running")),
            JobRow.attempt == row.attempt).values(**stopping(why, sig, grace, now)))
        if done.rowcount != 1:
            raise Conflict(f"job {_named(row)} is {s.get(JobRow, job_id).state} now; only "
                           "an admitted or running job can be requeued")
        svc._event(s, "requeue", f"{why}; back in the queue under the same id once its "
                   "replicas have stopped", job=job_id)
    svc.wake.set()
    return svc.get(job_id)
