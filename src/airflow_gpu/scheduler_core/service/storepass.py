"""The scheduling pass on the store: rebuild the engine's state from what is committed,
run the one scheduling pass (`Scheduler.schedule`), and write the admissions (allocations
and holds) and the changed pending reasons in one transaction. With PostgreSQL that
transaction first locks the leader's lease row with its fencing token (leadership.py `fence`):
a leader that was taken over writes nothing."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..engine.cluster import Cluster
from ..engine.mig import mig_slots
from ..engine.state import ClusterState, ReplicaAllocation
from ..jobspec import JobSpec
from ..policy.scheduler import Rejected, Scheduler
from ..policy.types import account
from ..policy.windows import window_of
from ..store.models import (
    AllocationRow,
    CpuHoldRow,
    GpuHoldRow,
    GpuRow,
    HostRow,
    JobRow,
    MigHoldRow,
)
from ..units import format_duration
from . import arrays, dependencies, passerrors, quarantine, reserving
from .agents import silent_hosts
from .common import LIVE, PENDING, _ts, _update, not_held, schedulable, spec_gpus, utcnow
from .faults import handle_gpu_faults
from .idle import queue_entry
from .preemption import broken_guarantee, mark_preempting
from .uow import Store
from .wear import worn_gpus

log = logging.getLogger(__name__)


def run_pass(svc: Store) -> list[str]:
    """One pass of the engine on the committed state; admits by writing allocations and
    holds in one transaction. Returns the admitted job ids."""
    now = utcnow()
    t_now = _ts(now)
    svc.pass_errors, svc.preemptions = [], []
    policy = svc._policy()
    svc.refresh_cluster()
    cluster = svc.cluster         # one cluster for the whole pass, whatever registers meanwhile
    fence = getattr(svc, "leader_fence", None)     # set by the scheduling loop (loop.py)
    with svc.sessions.begin() as s:
        if fence is not None:     # first: still the leader, or this pass writes nothing
            fence(s)
        handle_gpu_faults(svc, s, now)      # also jobs admitted while a report was in flight
        windows = reserving.apply(svc, s, now)     # admins' reservations: drains, ends
        said = _let_in(svc, s)              # jobs whose dependencies hold, array turns
        state = ClusterState(cluster)
        for h in s.scalars(select(HostRow).where(HostRow.drained.is_(True))):
            if h.name in cluster.by_name and not reserving.skip_drain(h, windows, t_now):
                state.set_drained(h.name)
                state.drain_reasons[h.name] = h.drain_reason
        silent = silent_hosts(s, svc.settings.host_timeout, now)
        for name in sorted(silent):       # unreachable: no new work, like a drained host
            if name in cluster.by_name and not state.hosts[cluster.by_name[name].index].drained:
                state.set_drained(name)
                state.drain_reasons[name] = "unreachable"
            if name not in svc._silent:
                svc._event(s, "host", f"host {name} is unreachable: no report from its node "
                           f"agent for over {svc.settings.host_timeout:g}s; it gets no new "
                           "work until it reports again", host=name)
        bad: dict[str, list[int]] = {}
        for g in s.scalars(select(GpuRow).where(GpuRow.healthy.is_(False))):
            bad.setdefault(g.host, []).append(g.index)
        for name, indexes in bad.items():
            if name in cluster.by_name:
                state.set_unhealthy_gpus(name, indexes)
        for name, worn in worn_gpus(s, now).items():     # scored down, not excluded
            if name in cluster.by_name:
                state.set_degraded_gpus(name, worn)
        quarantine.apply(svc, s, state, cluster)     # wrong hold rows: placed elsewhere
        sched = Scheduler(state, policy, svc.reg, now=t_now,
                          timemodel=svc.slowdown.update(s, policy, cluster))
        sched.set_windows(windows)
        specs: dict[str, tuple] = {}    # the live and pending jobs' parsed specs
        _restore(svc, cluster, s, sched, t_now, specs)
        pending = list(s.scalars(select(JobRow).where(JobRow.state == PENDING, schedulable())
                                 .order_by(JobRow.submitted_at, JobRow.id)))
        for row in pending:
            try:
                queued, behind = queue_entry(row)      # requeued as idle: behind
                sched.submit(_spec(svc, row, specs), queued,
                             preempted_by=frozenset(row.preemptors or ()), behind=behind)
                if row.promised_at is not None:
                    sched.promised[row.id] = row.promised_at
                if row.reason_code == "Preempting":     # its victims stop for it
                    sched.claims[row.id] = list(row.details.get("victims", ()))
            except Rejected as exc:   # the cluster shrank under it
                if (row.reason_code, row.reason) != ("Rejected", exc.reason):
                    s.execute(_update(JobRow).where(JobRow.id == row.id,
                                                    JobRow.state == PENDING).values(
                        reason_code="Rejected", reason=exc.reason, eta_at=None))
            except Exception as exc:  # one job's bad data must not stop the pass
                passerrors.pending_job(svc, s, row, exc)
        svc._specs = specs
        result = sched.schedule(t_now, explain=True)
        passerrors.finish(svc, s, {**svc.policy_errors, **sched.fairshare.errors})
        # stamped after the reads, not at `now`: a finish that freed these GPUs may have
        # committed while this pass waited for the database, and no job may be admitted
        # before the one it replaces ended (accounting, sacct's overlap)
        stamp = max(now, utcnow())
        lease = stamp + timedelta(seconds=svc.settings.lease_ttl)
        admitted = []
        for job, placed in result.started:
            # its own limit stops it (deadline_at); a cut only makes it yield (overrun.py)
            cut_at, cut_by = result.cut.get(job.name, (None, None))
            window = window_of(cut_by) if cut_by else None
            deadline = min(_ts(stamp) + job.limit, result.until.get(job.name, math.inf))
            done = s.execute(_update(JobRow).where(
                JobRow.id == job.name, JobRow.state == PENDING, not_held()).values(
                state="admitted", admitted_at=stamp, lease_expires_at=lease,
                attempt=JobRow.attempt + 1,
                reason_code=None, reason=None, details={}, eta_at=None, promised_at=None,
                deadline_at=None if deadline == math.inf else
                datetime.fromtimestamp(deadline, UTC),
                yield_at=None if cut_at is None else datetime.fromtimestamp(cut_at, UTC),
                stop_grace=round(job.grace), limit_cut_by=None if window else cut_by,
                yield_reservation=window, borrowed=job.borrowed))
            if done.rowcount != 1:
                continue              # cancelled or held meanwhile
            _write_allocations(s, job.name, placed.allocations, stamp)
            hosts = ", ".join(dict.fromkeys(a.host.name for a in placed.allocations))
            svc._event(s, "admitted", f"admitted on {hosts or 'no GPU host'}"
                       + limit_note(job.limit, (cut_at or t_now) - t_now, cut_by,
                                    result.until.get(job.name))
                       + ("; on borrowed quota (it may be reclaimed)" if job.borrowed
                          else ""), job=job.name)
            admitted.append(job.name)
        svc.preemptions = [p.reason for p in result.preempted
                           if mark_preempting(svc, s, p)]
        rows = {r.id: r for r in pending}
        for job_id, why in result.pending.items():
            r = rows[job_id]
            why = broken_guarantee(r, why)
            eta_at = None if why.eta is None else round(t_now + why.eta)
            promised = sched.promised.get(job_id)
            if (r.reason_code, r.reason, r.details, r.eta_at, r.promised_at) == (
                    why.code, why.message, why.details, eta_at, promised):
                continue              # unchanged: no write (a pass must stay cheap)
            done = s.execute(_update(JobRow).where(JobRow.id == job_id,
                                                   JobRow.state == PENDING, not_held()).values(
                reason_code=why.code, reason=why.message, details=why.details,
                eta_at=eta_at, promised_at=promised))
            if why.code == "DeadlineAtRisk" and r.reason_code != why.code and done.rowcount:
                svc._event(s, "deadline", why.message, job=job_id)    # once, as it turns
    svc._silent = silent
    for owner, why in said.items():        # the reasons now committed: not written again
        if why is None:
            svc.dep_reasons.pop(owner, None)
        else:
            svc.dep_reasons[owner] = why
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


def _spec(svc: Store, row: JobRow, specs: dict[str, tuple]) -> JobSpec:
    """A job's spec, parsed once while the job is pending or live; parsed again when its
    priority or time limit was updated (jobcontrol.update)."""
    key = (row.priority, row.spec.get("time_limit"))
    cached = svc._specs.get(row.id)
    spec = cached[1] if cached is not None and cached[0] == key else \
        JobSpec.model_validate({**row.spec, "name": row.id})
    specs[row.id] = (key, spec)
    return spec


def _restore(svc: Store, cluster: Cluster, s: Session, sched: Scheduler, t_now: float,
             specs: dict[str, tuple]) -> None:
    rows = list(s.scalars(select(JobRow).where(JobRow.state.in_(LIVE))))
    allocs: dict[str, list[AllocationRow]] = {}
    for a in s.scalars(select(AllocationRow).where(AllocationRow.live.is_(True))
                       .order_by(AllocationRow.id)):
        allocs.setdefault(a.job_id, []).append(a)
    past_usage(svc, s, sched.fairshare, t_now, rows)
    for row in rows:
        held = allocs.get(row.id, [])
        try:
            spec = _spec(svc, row, specs)
            start = _ts(row.admitted_at)
            if any(a.host not in cluster.by_name for a in held):
                continue      # its host left the cluster; the lease decides what happens
            sched.restore(spec, [_to_engine(cluster, a) for a in held], start,
                          deadline=_stop_at(row),
                          borrowed=row.borrowed, preempted_by=frozenset(row.preemptors or ()),
                          stopping=(row.preempted_by, _ts(row.preempt_deadline_at))
                          if row.state == "preempting" and row.preempt_deadline_at else None)
        except Exception as exc:  # one job's bad data must not stop the pass
            passerrors.live_job(svc, s, sched.state, cluster, row, held, exc)


def past_usage(svc: Store, s: Session, fairshare, t_now: float,
               live: list[JobRow]) -> None:
    """The GPU usage of the ended jobs (running totals: usage.py) and of the `live` ones
    into the fair share: what each pass orders by (and `priority.py` shows)."""
    svc.ended_usage.add_to(s, fairshare, t_now, float(svc.settings.policy.fairshare_half_life))
    for row in live:
        if row.admitted_at is not None:
            fairshare.add_past(account(row.team, row.user), spec_gpus(row.spec),
                               _ts(row.admitted_at), t_now)


def _to_engine(cluster: Cluster, a: AllocationRow) -> ReplicaAllocation:
    host = cluster.by_name[a.host]
    t = host.type
    cpu_masks: dict[int, int] = {}
    for c in a.cpus:
        p = next(i for i, m in enumerate(t.numa_cpus) if m >> c & 1)
        cpu_masks[p] = cpu_masks.get(p, 0) | 1 << c
    mem = [(t.numa_ids.index(int(n)), b) for n, b in a.memory_by_numa.items()]
    return ReplicaAllocation(a.job_id, a.role, a.replica, host,
                             sum(1 << g for g in a.gpus), sorted(cpu_masks.items()),
                             sorted(mem), list(a.nics), mig_slots(t.mig, a.mig))


def _write_allocations(s: Session, job_id: str, allocs: list[ReplicaAllocation],
                       now: datetime) -> None:
    for a in allocs:
        d = a.to_dict()
        s.add(AllocationRow(job_id=job_id, role=a.role, replica=a.index, host=a.host.name,
                            gpus=d["gpus"], cpus=d["cpus"],
                            memory_by_numa=d["memory_by_numa"], nics=d["nics"],
                            mig=d.get("mig"), live=True, granted_at=now))
        s.add_all(GpuHoldRow(host=a.host.name, gpu=g, job_id=job_id) for g in a.gpus)
        s.add_all(MigHoldRow(host=a.host.name, gpu=m.gpu, device=m.index, job_id=job_id)
                  for m in a.slices)
        s.add_all(CpuHoldRow(host=a.host.name, cpu=c, job_id=job_id) for c in a.cpus)
    s.flush()   # the hold keys are checked here, inside the pass's transaction



def _stop_at(row: JobRow) -> float | None:
    """When the planner counts a live job stopped: its time limit, or its yield to a
    reservation (overrun.py) where that comes first."""
    at = [_ts(t) for t in (row.deadline_at, row.yield_at) if t is not None]
    return min(at) if at else None


def limit_note(limit: float, left: float, cut_by: str | None,
               until: float | None = None) -> str:
    """What the admission event says of the job's time limit and its yield."""
    own = f"; time limit {format_duration(limit)}" if limit < math.inf else ""
    if until is not None:
        own += (f"; stopped at its reservation's end, "
                f"{datetime.fromtimestamp(until, UTC).isoformat()}")
    if cut_by and window_of(cut_by):
        return own + reserving.yield_note(window_of(cut_by), left)
    if cut_by:
        return (f"{own}; it backfills ahead of the reservation for job {cut_by}: if it "
                f"runs past its expected runtime into it (in {format_duration(max(0, left))})"
                ", it is stopped and requeued under the same id")
    return own
