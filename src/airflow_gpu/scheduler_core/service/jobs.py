"""Jobs and their lifecycle: submit (idempotent per team and key), read, cancel, finish
and heartbeat. State changes are guarded updates (`... WHERE state IN (...)`), so a
cancel racing the pass can never be overwritten by an admission, and the hold tables'
keys make the database refuse a GPU or core granted twice."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError, IntegrityError

from ..engine.placement import compile_needs, never_fits
from ..jobclasses import resolve
from ..jobspec import JobSpec
from ..policy.jobqueue import job_shape
from ..policy.quota import over_quota, spec_need
from ..policy.scheduler import Rejected
from ..store.models import AllocationRow, EventRow, JobRow
from . import rights, submitlimits
from .common import (
    LIVE,
    PENDING,
    QUIET,
    Principal,
    _same_attempt,
    _stale,
    _update,
    same_job,
    spec_digest,
    utcnow,
)
from .errors import Conflict, Forbidden, NotFound
from .notify import check_job, job_column
from .uow import Store

# Built once: the statement's compiled form is then cached by SQLAlchemy.
INSERT_JOB = insert(JobRow)


def submit(svc: Store, spec: JobSpec, who: Principal,
           key: str | None = None) -> tuple[JobRow, bool]:
    """Queue a job; (row, created). The same idempotency key (per team) returns the
    job it created first; with another spec it is a Conflict. Raises Rejected (can
    never run) or InputError (bad class)."""
    values = job_values(svc, spec, who, key)
    _within_limits(svc, values)
    done = _insert(svc, values)
    if done[1]:
        svc.wake.set()
    return done


def submit_many(svc: Store, asks: list[tuple[JobSpec, Principal, str | None]]
                ) -> list[tuple[JobRow, bool] | Exception]:
    """submit() for several callers at once (the API's concurrent submits): what each would
    get, in order, a (row, created) pair or the exception submit() would raise. The new jobs
    go in one transaction, which costs little more than one job's; when the database
    refuses one of them (a key it has seen, a value it cannot store) nothing of it is
    stored and each is submitted alone, as submit() does."""
    out: list = [None] * len(asks)
    together: list[tuple[int, dict]] = []
    alone: list[tuple[int, dict]] = []
    keys: set[tuple[str, str]] = set()
    for i, (spec, who, key) in enumerate(asks):
        try:
            values = job_values(svc, spec, who, key)
            _within_limits(svc, values)
        except Exception as exc:       # noqa: BLE001 - its caller raises it, as submit() would
            out[i] = exc
            continue
        seen = (values["team"], values["idempotency_key"])
        if seen[1] is not None and seen in keys:
            alone.append((i, values))       # a key twice: after the first is stored
            continue
        keys.add(seen)
        together.append((i, values))
    if len(together) > 1 and _insert_together(svc, [v for _, v in together]):
        for i, values in together:
            out[i] = (JobRow(**values), True)
    else:
        alone = together + alone
    for i, values in alone:
        try:
            out[i] = _insert(svc, values)
        except Exception as exc:       # noqa: BLE001 - as above
            out[i] = exc
    if any(isinstance(o, tuple) and o[1] for o in out):
        svc.wake.set()
    return out


def _within_limits(svc: Store, values: dict) -> None:
    """The team's and user's max_submit_jobs (submitlimits.py); a retry of a job already
    stored (its idempotency key) is never refused for them."""
    try:
        submitlimits.admit(svc, Counter({(values["team"], values["user"]): 1}))
    except submitlimits.OverLimit:
        if not values["idempotency_key"] or by_key(svc, values["team"],
                                                   values["idempotency_key"]) is None:
            raise


def _insert(svc: Store, values: dict) -> tuple[JobRow, bool]:
    """Store one new job: (its row, True), or (the job its key named first, False)."""
    try:   # the unique (team, key) index answers "seen before?" without a lookup
        # One INSERT that commits itself (one round trip); the job's "submitted" event
        # is its submitted_at.
        with svc._autocommit.connect() as conn:
            conn.execute(INSERT_JOB, values)
    except IntegrityError:
        found = by_key(svc, values["team"], values["idempotency_key"]) \
            if values["idempotency_key"] else None
        if found is None:
            raise
        same_job(found, JobRow(**values))
        return found, False
    return JobRow(**values), True


def _insert_together(svc: Store, rows: list[dict]) -> bool:
    """Store these new jobs in one transaction: True once committed; False when an insert
    failed, nothing stored (an error at the commit itself is raised: it may have
    committed, so no job is inserted again)."""
    with svc.engine.connect() as conn:
        tx = conn.begin()
        try:
            conn.execute(INSERT_JOB, rows)
        except DBAPIError:
            tx.rollback()
            return False
        tx.commit()
    return True


def job_row(svc: Store, spec: JobSpec, who: Principal, key: str | None = None) -> JobRow:
    """The row a submit inserts, once `who` may submit `spec` and it can run: raises
    Forbidden (another team's), Rejected (can never run) or InputError (bad class).
    Shared by the single and the batch submit (batch.py)."""
    return JobRow(**job_values(svc, spec, who, key))


def job_values(svc: Store, spec: JobSpec, who: Principal, key: str | None = None) -> dict:
    """job_row's columns (those a new job sets; the others are NULL or their default)."""
    key = key or None                 # an empty key is no key
    if "team" not in spec.model_fields_set:
        spec = spec.model_copy(update={"team": who.team})
    team = spec.team
    if not who.may_act_for(team):
        raise Forbidden(f"team: your token is for team {who.team!r}, not {team!r}")
    if who.user is not None:          # a user's token: its jobs are that user's, whatever
        spec = spec.model_copy(update={"user": who.user})     # the spec says
    resolved = resolve(spec, svc.reg.job_classes, defaults=svc._policy().defaults)
    why = rejection(svc, resolved, spec.time_limit)
    if why:
        raise Rejected(spec.name, why)
    check_job(svc, spec, team)             # its webhook: allowed, and signed
    return dict(id=str(uuid.uuid4()), name=spec.name, team=team, idempotency_key=key,
                spec={**spec.model_dump(mode="json", exclude_unset=True), "team": team,
                      **({"user": spec.user} if spec.user else {})},
                state=PENDING, priority=spec.priority, details={}, attempt=0,
                reservation=spec.reservation, user=spec.user,
                borrowed=False, preemptions=0, idle_requeues=0, notify=job_column(spec),
                # what a retry with the same key must match (none without a key)
                spec_digest=spec_digest(spec) if key else None,
                submitted_at=utcnow())


def by_key(svc: Store, team: str, key: str) -> JobRow | None:
    with svc.reads() as s:
        return s.scalars(select(JobRow).where(
            JobRow.team == team, JobRow.idempotency_key == key)).first()


def rejection(svc: Store, spec: JobSpec, asked_limit: float | None = None) -> str | None:
    """Why a (resolved) job can never run; `asked_limit`: the time limit its spec gave."""
    svc.refresh_cluster()
    if spec.reservation is not None:       # on that reservation's hosts only, no quota
        from .reserving import reservation_refusal

        return reservation_refusal(svc, spec, asked_limit)
    jc = svc.reg.job_classes.get(spec.job_class or "")
    why = over_quota(svc._policy(), spec.team, spec_need(spec),
                     jc is None or jc.preemptible)
    if why:
        return why
    key, never, empty = job_shape(spec), svc._never, svc._empty
    if key not in never:
        never[key] = never_fits(spec, empty, svc.reg, compile_needs(spec))
    return never[key]


def list_jobs(svc: Store, state: str | None = None, team: str | None = None,
              limit: int = 1000, name: str | None = None,
              newest_first: bool = False) -> list[JobRow]:
    order = (JobRow.submitted_at.desc(), JobRow.id.desc()) if newest_first else (
        JobRow.submitted_at, JobRow.id)
    q = select(JobRow).order_by(*order).limit(limit)
    if state:
        q = q.where(JobRow.state == state)
    if team:
        q = q.where(JobRow.team == team)
    if name:
        q = q.where(JobRow.name == name)
    with svc.reads() as s:
        return list(s.scalars(q))


def allocations(svc: Store, job_id: str) -> list[AllocationRow]:
    with svc.reads() as s:
        return list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)
                              .order_by(AllocationRow.id)))


def live_allocations(svc: Store, job_ids: list[str]) -> dict[str, list[AllocationRow]]:
    """Live allocations of these jobs, in one query."""
    out: dict[str, list[AllocationRow]] = {}
    with svc.reads() as s:
        for a in s.scalars(select(AllocationRow).where(
                AllocationRow.live.is_(True), AllocationRow.job_id.in_(job_ids))
                .order_by(AllocationRow.id)):
            out.setdefault(a.job_id, []).append(a)
    return out


def events(svc: Store, job_id: str) -> list[EventRow]:
    job = svc.get(job_id)
    with svc.reads() as s:
        stored = list(s.scalars(select(EventRow).where(EventRow.job_id == job_id)
                                .order_by(EventRow.id)))
    by = f"user {job.user} of team {job.team}" if job.user else f"team {job.team}"
    return [EventRow(at=job.submitted_at, job_id=job_id, kind="submitted",
                     message=f"submitted by {by}"), *stored]


def cancel(svc: Store, job_id: str, who: Principal) -> JobRow:
    return end(svc, job_id, who, "cancelled", None, from_states=(PENDING, *LIVE))


def finish(svc: Store, job_id: str, who: Principal, outcome: str,
           exit_code: int | None, attempt: int | None = None) -> JobRow:
    if outcome == "preempted":
        from .preemption import stopped

        svc._owned(job_id, who)
        return stopped(svc, job_id, attempt)
    return end(svc, job_id, who, outcome, exit_code, from_states=LIVE, attempt=attempt)


def end(svc: Store, job_id: str, who: Principal, state: str, exit_code: int | None,
        from_states: tuple[str, ...], attempt: int | None = None) -> JobRow:
    svc._owned(job_id, who)
    with svc.sessions.begin() as s:
        done = s.execute(_update(JobRow).where(
            JobRow.id == job_id, JobRow.state.in_(from_states),
            *_same_attempt(attempt)).values(
            state=state, finished_at=utcnow(), exit_code=exit_code,
            outcome=state, lease_expires_at=None))
        if done.rowcount != 1:
            current = s.get(JobRow, job_id)
            if current.state == state:
                return current            # repeating a cancel or finish is harmless
            raise Conflict(_stale(current, attempt, f"only a job that is "
                                  f"{' or '.join(from_states)} can become {state}"))
        svc._release(s, job_id)
        svc._event(s, state, f"{state}" + (f" (exit code {exit_code})"
                                           if exit_code is not None else ""), job=job_id)
    svc.wake.set(freed=True)
    return svc.get(job_id)


def heartbeat(svc: Store, job_id: str, who: Principal, attempt: int | None = None,
              ) -> tuple[JobRow, list[AllocationRow]]:
    """The launcher is alive: extend the lease; the first heartbeat marks it running.
    With `attempt`, only that admission counts: a launcher that missed a requeue and
    re-admission hears 409 instead of confirming placements it never started. Returns
    the job as it now is and its allocations, read in the same transaction: 8,000
    running jobs beat 400 times a second, so a beat is one short transaction, and one
    that only extends the lease keeps the row's revision (QUIET: the leader, which does
    not read leases, does not read the row again)."""
    same = _same_attempt(attempt)
    with svc.sessions.begin() as s:
        s.connection()        # begun (on SQLite: the write lock held) before the clock is
        now = utcnow()        # read: a wait for a busy database does not shorten the lease
        lease = now + timedelta(seconds=svc.settings.lease_ttl)
        row = s.scalars(_update(JobRow).where(
            JobRow.id == job_id, JobRow.state.in_(("running", "preempting")), *same)
            .values(lease_expires_at=lease, rev=QUIET).returning(JobRow)).first()
        if row is not None:     # refused: the transaction, the lease's extension with it,
            rights.check(who, row)              # rolls back
        else:                   # its first beat, or a stale, unknown or foreign one
            row = s.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"job {job_id!r} does not exist")
            rights.check(who, row)
            started = s.execute(_update(JobRow).where(
                JobRow.id == job_id, JobRow.state == "admitted", *same).values(
                state="running", started_at=now, lease_expires_at=lease))
            if started.rowcount != 1:
                raise Conflict(_stale(row, attempt, "admitted or running jobs take "
                                                    "heartbeats"))
            svc._event(s, "running", "the launcher confirmed the start", job=job_id)
            s.refresh(row)
        allocs = list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)
                                .order_by(AllocationRow.id)))
    return row, allocs
