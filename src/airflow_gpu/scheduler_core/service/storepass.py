"""The scheduling pass on the store. The leader's state in memory (warm.py) is brought up
to date with what changed in the store (one short read), the one scheduling pass
(`Scheduler.schedule`) decides outside any transaction, and the admissions (allocations
and holds), preemptions and the pending reasons that changed are written in one short
transaction. Every transaction that writes first locks the leader's lease row with its
fencing token on PostgreSQL (leadership.py `fence`): a leader that was taken over writes
nothing. A pass that fails leaves nothing of itself in memory: the next one reads the
state anew."""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import datetime

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from ..engine.cluster import Cluster
from ..jobspec import JobSpec
from ..policy.scheduler import Scheduler
from ..policy.types import account
from ..store.bulk import update_rows
from ..store.models import JobRow
from . import arrays, dependencies, passerrors, quarantine, reserving, warm
from .admit import admit
from .common import PENDING, _ts, not_held, spec_gpus, utcnow
from .faults import handle_gpu_faults
from .preemption import broken_guarantee, mark_preempting
from .uow import Store

log = logging.getLogger(__name__)

_PENDING_NOT_HELD = (JobRow.state == PENDING, not_held())


def run_pass(svc: Store, explain: bool = True) -> list[str]:
    """One pass of the engine on the leader's state, brought up to date with the store
    (warm.py); admits by writing allocations and holds. Returns the admitted job ids."""
    now = utcnow()
    svc.pass_errors, svc.preemptions, svc.rebuilt = [], [], []
    policy = svc._policy()
    svc.refresh_cluster()
    cluster = svc.cluster         # one cluster for the whole pass, whatever registers meanwhile
    fence = getattr(svc, "leader_fence", None)     # set by the scheduling loop (loop.py)
    # however long the pass takes (a cold read of a long queue, a big write), the loop
    # renews the lease meanwhile (leadership.py `kept`)
    with (getattr(svc, "leader_keep", None) or contextlib.nullcontext)():
        return _run(svc, now, policy, cluster, fence, explain)


def _run(svc: Store, now: datetime, policy, cluster: Cluster, fence,
         explain: bool) -> list[str]:
    phases = Phases(explain)
    with svc.sessions.begin() as s:       # what comes before deciding: short, fenced
        if fence is not None:     # first: still the leader, or this pass writes nothing
            fence(s)
        handle_gpu_faults(svc, s, now)      # also jobs admitted while a report was in flight
        windows = reserving.apply(svc, s, now)     # admins' reservations: drains, ends
        said = _let_in(svc, s)              # jobs whose dependencies hold, array turns
    phases.done("before")
    for owner, why in said.items():        # the reasons now committed: not written again
        if why is None:
            svc.dep_reasons.pop(owner, None)
        else:
            svc.dep_reasons[owner] = why
    try:
        try:
            return _decide(svc, cluster, policy, windows, now, fence, phases)
        except IntegrityError as exc:
            # a hold it wrote met a row it did not know of (written behind its back):
            # nothing was written, and the state read anew looks for such rows
            log.warning("a scheduling pass's admissions met rows the leader did not know "
                        "of (%s); its state is read anew from the store and the pass runs "
                        "again", exc.orig)
            svc.warm = None
            return _decide(svc, cluster, policy, windows, now, fence, phases)
    except BaseException:
        svc.warm = None      # nothing half-applied stays in memory: the next pass rebuilds
        raise


def _decide(svc: Store, cluster: Cluster, policy, windows, now: datetime,
            fence, phases: Phases) -> list[str]:
    """Read what changed (one snapshot), decide outside any transaction, then write."""
    t_now = _ts(now)
    later: list = []                  # what the write does first (errors told on jobs)
    began = time.monotonic()
    r = warm.read(svc, cluster, policy, windows, now)    # no transaction open while it
    phases.done("read")
    with svc.state_lock:        # the views read the leader's engine (priority.py)
        sched = warm.update(svc, r, policy, windows, t_now, later)     # decides
        phases.done("update")
        result = sched.schedule(t_now, explain=phases.explained)    # unexplained: no reasons
        reasons = _reasons(r.warm, sched, result, t_now)
    if r.rebuilt:
        svc.rebuilt.append(r.rebuilt)
    phases.done("decide")
    admitted = _write(svc, r.warm, sched, result, r, now, fence, later, reasons)
    phases.done("write")
    svc.pass_phases = phases
    r.warm.read_at, r.warm.done_mark = began, r.warm.mark     # what the views compare
    svc.warm = r.warm
    svc._silent = r.silent
    return admitted


class Phases:
    """Seconds each part of a pass took (/healthz's `last_pass_phases`, the metric
    airflow_gpu_scheduling_pass_phase_seconds): what before deciding (faults,
    reservations, dependencies), the read of what changed, the update of the state in
    memory, the decision (and its reasons), the write."""

    def __init__(self, explain: bool):
        self.explained = explain
        self.seconds: dict[str, float] = {}
        self._at = time.perf_counter()

    def done(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._at
        self._at = now


def _reasons(w: warm.Warm, sched: Scheduler, result, t_now: float) -> list[tuple]:
    """The pending reasons that changed since the leader last wrote them (most do not),
    as (the job, what to write): worked out before the write's transaction opens."""
    out = []
    for job_id, why in result.pending.items():
        k = w.jobs[job_id]
        why = broken_guarantee(k, why)
        eta_at = None if why.eta is None else round(t_now + why.eta)
        said = (why.code, why.message, why.details, eta_at, sched.promised.get(job_id))
        if (k.reason_code, k.reason, k.details, k.eta_at, k.promised_at) != said:
            out.append((k, said))
    return out


def _write(svc: Store, w: warm.Warm, sched: Scheduler, result, r: warm.Read, now: datetime,
           fence, later: list, wrote: list[tuple]) -> list[str]:
    """The pass's decisions in one short transaction, fenced: admissions, preemptions,
    and the pending reasons that changed (in bulk). Rows it changed are read again by the
    next pass, but for the reasons, whose revision it knows."""
    t_now = _ts(now)
    with svc.sessions.begin() as s:
        if fence is not None:
            fence(s)
        for step in later:
            step(s)
        passerrors.finish(svc, s, {**svc.policy_errors, **sched.fairshare.errors})
        for name in sorted(r.silent - svc._silent):
            if name in w.cluster.by_name:
                svc._event(s, "host", f"host {name} is unreachable: no report from its node "
                           f"agent for over {svc.settings.host_timeout:g}s; it gets no new "
                           "work until it reports again", host=name)
        if r.found is not None:
            quarantine.tell(svc, s, r.found)
        # stamped after the reads, not at `now`: a finish that freed these GPUs may have
        # committed while this pass waited for the database, and no job may be admitted
        # before the one it replaces ended (accounting, sacct's overlap)
        stamp = max(now, utcnow())
        admitted = admit(svc, s, result, stamp, t_now)
        svc.preemptions = [p.reason for p in result.preempted
                           if mark_preempting(svc, s, p)]
        for job_id in (*admitted, *(p.victim.name for p in result.preempted)):
            if job_id in w.jobs:
                w.jobs[job_id].rev = -1        # read again: what the engine holds of it
        changed = [{"id": k.id, "reason_code": said[0], "reason": said[1],
                    "details": said[2], "eta_at": said[3], "promised_at": said[4]}
                   for k, said in wrote]
        for k, said in wrote:
            if said[0] == "DeadlineAtRisk" and k.reason_code != said[0]:
                svc._event(s, "deadline", said[1], job=k.id)    # once, as it turns
        if changed:     # only where still pending and not held (a hold is its reason)
            update_rows(s.connection(), JobRow.__table__, ("id",), changed,
                        where=_PENDING_NOT_HELD)
    # committed: the leader knows these rows as written (a row another writer changed
    # meanwhile has another revision, and is read again)
    for k, said in wrote:
        k.reason_code, k.reason, k.details, k.eta_at, k.promised_at = said
        k.rev += 1
    return admitted


def _let_in(svc: Store, s: Session) -> dict[str, str | None]:
    """The waiting jobs whose dependencies now hold, then array elements as their turns
    come (dependencies.py, arrays.py). A fault of theirs must not stop scheduling: what
    they wrote is undone (a savepoint), those jobs wait on, and it is logged and counted;
    a database error stops the pass as any other does."""
    try:
        with s.begin_nested():
            said = dependencies.advance(svc, s)
            arrays.give_turns(svc, s)
        return said
    except DBAPIError:
        raise
    except Exception as exc:      # noqa: BLE001 - logged, counted, the pass goes on
        svc.pass_errors.append("job")
        log.error("letting in jobs whose dependencies hold or whose array turn came failed; "
                  "they wait on: %s", exc, exc_info=exc)
        return {}


def job_spec(row: JobRow) -> JobSpec:
    """A stored job's spec, parsed (the views that build the queue as a pass would)."""
    return JobSpec.model_validate({**row.spec, "name": row.id})


def past_usage(svc: Store, s: Session, fairshare, t_now: float,
               live: list[JobRow]) -> None:
    """The GPU usage of the ended jobs (running totals: usage.py) and of the `live` ones
    into the fair share: what `priority.py` shows (a pass: warm.py)."""
    svc.ended_usage.add_to(s, fairshare, t_now, float(svc.settings.policy.fairshare_half_life))
    for row in live:
        if row.admitted_at is not None:
            fairshare.add_past(account(row.team, row.user), spec_gpus(row.spec),
                               _ts(row.admitted_at), t_now)
