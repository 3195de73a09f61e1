"""The scheduling leader's state between passes: the engine's scheduler (cluster state,
queue, reservations) and what the leader last read of each job it schedules, kept in
memory and brought up to date with what changed in the store since the last pass, as
slurmctld keeps its job and node tables instead of rereading the world every cycle.

The store stays the truth. Every UPDATE of a job row bumps its revision (migration
0020's trigger, whoever writes it; a heartbeat that only extends a lease keeps it:
0021) and marks where it changed (0023), so a pass reads the revisions of the rows
changed since its last read (all pending and live ones when its state is new), then
only the rows whose revision it has not seen, all in one snapshot: a new job is
submitted to the engine, a gone one finished, one whose change matters to the engine
(its state, priority, limits, preemption) replaced, and one whose change does not (a
heartbeat, a reason written by the pass) only noted. Hosts (drains, unreachable agents,
GPU health and wear) are compared with the last pass's and changed host by host.

The scheduler is built anew from memory when the policy changes, the running jobs
holding what they held; when the learned time model changed (at most every `MODEL_EVERY`
seconds) its jobs are taken out and in again over the next passes (retime.py); it is built
from the store (every row read again) when this replica becomes the
leader, when the cluster changes, after a pass that failed (storepass.py drops the
state), and when the check of a slice of the hosts (check.py) finds the live allocations
or the wrong hold rows (quarantine.py) there differ from what the engine holds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from ..engine.cluster import Cluster
from ..engine.mig import mig_slots
from ..engine.state import ClusterState, ReplicaAllocation
from ..jobclasses import Defaults
from ..policy.config import PolicyConfig
from ..policy.fairshare import FairShare
from ..policy.scheduler import Rejected, Scheduler
from ..policy.timemodel import LocalityModel
from ..policy.windows import Window
from ..store import integrity
from ..store.models import AllocationRow, GpuRow, HostRow, JobRow
from . import passerrors, quarantine, reserving
from .agents import silent_hosts
from .check import CHECK_EVERY, check
from .common import LIVE, PENDING, _ts, _update, schedulable
from .idle import queue_entry
from .known import COLUMNS, Known
from .liveuse import LiveUse
from .retime import drop, retime
from .wear import worn_gpus

log = logging.getLogger(__name__)
MEMBER = or_(and_(JobRow.state == PENDING, schedulable()), JobRow.state.in_(LIVE))

CHUNK = 1000            # ids per IN (...) read
INTAKE = 2000           # jobs new to the leader a pass takes in (but the first: all)

@dataclass
class Hosts:
    """What keeps hosts and GPUs from new work, as one pass read it."""
    drained: dict[str, str | None]          # host -> why it takes no new work
    bad: dict[str, tuple[int, ...]]         # host -> unhealthy GPUs
    worn: dict[str, dict[int, str]]         # host -> worn GPUs and why


class Warm:
    """The leader's state between passes (see the module's docstring)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.jobs: dict[str, Known] = {}
        self.sched: Scheduler | None = None
        self.policy: PolicyConfig | None = None
        self.defaults = Defaults()      # the policy's, which jobs' specs are resolved with
        self.tm_version: tuple | None = None
        self.built_at = time.monotonic()     # when the engine was built or the model taken in
        self.hosts = Hosts({}, {}, {})
        self.found: list[integrity.Finding] = []     # wrong hold rows, held on the state
        self.checked_at = time.monotonic()
        self.check_every = CHECK_EVERY       # seconds between checks of a slice (check.py)
        self.check_at = 0                    # the first host of the next slice checked
        self.broken: dict[str, set[str]] = {}        # live job not in the engine -> hosts
        self.failed: set[str] = set()    # jobs the engine could not take in (passerrors.py)
        self.revs: dict[str, int] = {}       # id -> revision of each pending and live job
        self.mark: int | None = None     # the rows changed at or above it are read next
        self.done_mark: int | None = None    # the mark as the last pass done left it
        self.read_at = 0.0                   # when the last pass done began (monotonic)
        self.live: LiveUse | None = None     # the running jobs' fair-share usage
        self.retime: list[str] = []      # jobs to plan with the new time model (last first)


@dataclass
class Read:
    """What one pass read, in one snapshot."""
    warm: Warm
    hosts: Hosts
    silent: set[str]
    timemodel: LocalityModel
    fairshare: FairShare
    revs: dict[str, int]                    # id -> revision of each pending and live job
    rows: dict                              # id -> the row of each job read again
    allocs: dict[str, list[AllocationRow]]  # the live allocations of those that are live
    found: list[integrity.Finding] | None   # wrong hold rows, when checked
    rebuilt: str | None = None              # why the state was read anew, if it was
    anew: str | None = None                 # why the engine is built anew from memory


def read(svc, cluster: Cluster, policy: PolicyConfig, windows: list[Window],
         now) -> Read:
    """Read what changed since the last pass (everything, when the state is new)."""
    t_now = _ts(now)
    w: Warm | None = getattr(svc, "warm", None)
    why = ("leader" if w is None else "cluster" if w.cluster is not cluster else None)
    if why:
        w = Warm(cluster)
    with svc.snapshot() as s:
        drained = {}
        for h in s.scalars(select(HostRow).where(HostRow.drained.is_(True))):
            if h.name in cluster.by_name and not reserving.skip_drain(h, windows, t_now):
                drained[h.name] = h.drain_reason
        silent = silent_hosts(s, svc.settings.host_timeout, now)
        for name in sorted(silent):       # unreachable: no new work, like a drained host
            if name in cluster.by_name:
                drained.setdefault(name, "unreachable")
        bad: dict[str, list[int]] = {}
        for g in s.scalars(select(GpuRow).where(GpuRow.healthy.is_(False))):
            if g.host in cluster.by_name:
                bad.setdefault(g.host, []).append(g.index)
        worn = {h: v for h, v in worn_gpus(s, now).items() if h in cluster.by_name}
        hosts = Hosts(drained, {h: tuple(sorted(v)) for h, v in bad.items()}, worn)
        timemodel = svc.slowdown.update(s, policy, cluster)
        fairshare = FairShare(policy, t_now)
        svc.ended_usage.add_to(s, fairshare, t_now, float(policy.fairshare_half_life))
        revs = _revisions(s, w)
        found = None
        if w.sched is not None:
            found, diverged = check(s, w, revs)
            if diverged:
                log.warning("the scheduler's state in memory differs from the store "
                            "(%s); it is read anew from the store", diverged)
                why, w = "divergence", Warm(cluster)
                revs = _revisions(s, w)
        if w.sched is None:             # read whole; afterwards checked in slices
            found = integrity.find(s, cluster)
        want = [i for i, rev in revs.items() if (k := w.jobs.get(i)) is None or k.rev != rev]
        anew = _anew(w, policy)
        if anew:    # the live jobs the engine does not hold are read again (update)
            want += [i for i in w.broken if i in revs and w.jobs[i].rev == revs[i]]
        elif w.sched is not None:
            want = _intake(s, w, want)
        rows = {r.id: r for ids in _chunks(want)
                for r in s.execute(select(*COLUMNS).where(JobRow.id.in_(ids)))}
        live = [i for i, r in rows.items() if r.state in LIVE]
        allocs: dict[str, list[AllocationRow]] = {}
        for ids in _chunks(live):
            for a in s.scalars(select(AllocationRow).where(
                    AllocationRow.live.is_(True), AllocationRow.job_id.in_(ids))
                    .order_by(AllocationRow.id)):
                allocs.setdefault(a.job_id, []).append(a)
    return Read(w, hosts, silent, timemodel, fairshare, revs, rows, allocs, found, why, anew)


def _intake(s: Session, w: Warm, want: list[str]) -> list[str]:
    """`want` with at most INTAKE jobs new to the leader, the first by priority and then
    submission: a burst of 20,000 submits took one pass seconds on 8,192 hosts (their
    rows, specs and first reasons); the rest are taken in by the next passes."""
    new = [i for i in want if i not in w.jobs]
    if len(new) <= INTAKE:
        return want
    order = [(-(p or 0), at, i) for ids in _chunks(new) for i, p, at in s.execute(
        select(JobRow.id, JobRow.priority, JobRow.submitted_at).where(JobRow.id.in_(ids)))]
    return [i for i in want if i in w.jobs] + [i for *_, i in sorted(order)[:INTAKE]]


def _revisions(s: Session, w: Warm) -> dict[str, int]:
    """The revision of every pending and live job (`w.revs`, brought up to date): all of
    them read when the state is new, else only the rows changed since the last read
    (migration 0023's `changed`: at or above the mark that read left)."""
    conn = s.connection()                   # Core rows: cheaper than the ORM's
    pg = conn.dialect.name == "postgresql"
    mark = conn.execute(select(func.txid_snapshot_xmin(func.txid_current_snapshot())) if pg
                        else select(func.coalesce(func.max(JobRow.changed), 0) + 1)).scalar()
    if w.mark is None:
        w.revs = dict(conn.execute(select(JobRow.id, JobRow.rev).where(MEMBER)).all())
    else:
        for job_id, rev, member in conn.execute(select(
                JobRow.id, JobRow.rev, case((MEMBER, True), else_=False))
                .where(JobRow.changed >= w.mark)):
            if member:
                w.revs[job_id] = rev
            else:                               # ended, held or blocked
                w.revs.pop(job_id, None)
    w.mark = mark
    return w.revs


def _anew(w: Warm, policy: PolicyConfig) -> str | None:
    """Why the engine is built anew from memory this pass, if it is: the policy changed
    (a changed time model is taken in job by job: retime.py)."""
    if w.sched is None:
        return None
    if policy != w.policy:
        return "policy"
    return None


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), CHUNK):
        yield ids[i:i + CHUNK]


def update(svc, r: Read, policy: PolicyConfig, windows: list[Window], t_now: float,
           later: list[Callable[[Session], None]]) -> Scheduler:
    """Bring the leader's scheduler up to date with what `r` read; what must be written
    (errors told on jobs) is added to `later` for the pass's write."""
    w = r.warm
    fresh = w.sched is None or r.anew is not None
    if r.anew and r.rebuilt is None:
        r.rebuilt = r.anew
    sched = w.sched
    for job_id in [i for i in w.jobs if i not in r.revs]:     # ended, held or blocked
        del w.jobs[job_id]
        w.broken.pop(job_id, None)
        w.failed.discard(job_id)
        if not fresh:
            drop(sched, job_id, t_now)
    todo = []
    for job_id, row in r.rows.items():
        old = w.jobs.get(job_id)
        k = w.jobs[job_id] = Known.of(row, old)
        if old is not None and old.engine_key() == k.engine_key():
            continue
        w.broken.pop(job_id, None)
        w.failed.discard(job_id)
        if not fresh:
            drop(sched, job_id, t_now)
        todo.append(k)
    held = {}     # what the engine being replaced holds: the live jobs not read again
    if fresh:
        held = w.sched.state.allocations if w.sched is not None else {}
        state = ClusterState(w.cluster)
        _hosts(state, Hosts({}, {}, {}), r.hosts)
        if r.found is not None:
            w.found = r.found
        quarantine.hold(state, w.cluster, w.found)
        sched = w.sched = Scheduler(state, policy, svc.reg, now=t_now,
                                    timemodel=r.timemodel)
        w.policy, w.tm_version, w.hosts = policy, r.timemodel.version, r.hosts
        w.defaults = policy.defaults
        w.built_at = time.monotonic()
        w.broken, w.failed, w.retime = {}, set(), []
        todo = list(w.jobs.values())
    sched.timemodel = r.timemodel
    sched.set_windows(windows)
    for k in todo:
        if k.state in LIVE:
            _restore(svc, w, sched, k, r, later, held.get(k.id))
    for k in todo:
        if k.state == PENDING:
            _submit(svc, w, sched, k, later)
    if not fresh:
        def again(k: Known, kept: list | None) -> None:
            if kept is None:
                _submit(svc, w, sched, k, later)
            else:
                _restore(svc, w, sched, k, r, later, kept)
        last = svc.pass_phases
        retime(w, sched, r.timemodel.version, {k.id for k in todo}, t_now,
               0.0 if last is None else sum(last.seconds.values()), again)
    # one error per job the engine could not take in, in each pass (the metric)
    svc.pass_errors.extend("job" for _ in w.failed)
    hosts = Hosts({**r.hosts.drained, **{h: None for hs in w.broken.values() for h in hs
                                         if h not in r.hosts.drained}},
                  r.hosts.bad, r.hosts.worn)
    _hosts(sched.state, w.hosts, hosts)
    w.hosts = hosts
    if fresh or w.live is None:     # a new engine: its jobs and charges are new
        w.live = LiveUse(float(policy.fairshare_half_life), t_now)
    w.live.sync(sched.running, w.jobs, r.rows.keys(), t_now)
    sched.fairshare = w.live.add_to(r.fairshare, t_now)
    return sched


def to_engine(cluster: Cluster, a: AllocationRow) -> ReplicaAllocation:
    """A stored allocation as the engine holds it."""
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


def _submit(svc, w: Warm, sched: Scheduler, k: Known, later: list) -> None:
    try:
        queued, behind = queue_entry(k)      # requeued as idle: behind
        sched.submit(k.resolved(sched.reg.job_classes, w.defaults), queued,
                     preempted_by=frozenset(k.preemptors or ()),
                     behind=behind, seq=k.seq)
        if k.promised_at is not None:
            sched.promised[k.id] = k.promised_at
        if k.reason_code == "Preempting":     # its victims stop for it
            sched.claims[k.id] = list(k.details.get("victims", ()))
    except Rejected as exc:   # the cluster shrank under it
        if (k.reason_code, k.reason) != ("Rejected", exc.reason):
            later.append(lambda s, why=exc.reason: s.execute(_update(JobRow).where(
                JobRow.id == k.id, JobRow.state == PENDING).values(
                reason_code="Rejected", reason=why, eta_at=None)))
    except Exception as exc:  # noqa: BLE001 - one job's bad data must not stop the pass
        w.failed.add(k.id)
        later.append(lambda s, exc=exc: passerrors.pending_job(svc, s, k, exc))


def _restore(svc, w: Warm, sched: Scheduler, k: Known, r: Read, later: list,
             kept: list[ReplicaAllocation] | None = None) -> None:
    """A live job into the engine: with the allocations read (a row read again), else
    with those the engine it replaces held (`kept`: built anew from memory)."""
    if k.id not in r.rows and kept is not None:
        sched.restore(k.resolved(sched.reg.job_classes, w.defaults), kept,
                      _ts(k.admitted_at), deadline=k.stop_at(),
                      borrowed=k.borrowed, preempted_by=frozenset(k.preemptors or ()),
                      stopping=_stopping(k))
        return
    held = r.allocs.get(k.id, [])
    try:
        if any(a.host not in w.cluster.by_name for a in held):
            w.broken[k.id] = set()   # not in the engine: no check of its holdings
            return    # its host left the cluster; the lease decides what happens
        sched.restore(k.resolved(sched.reg.job_classes, w.defaults),
                      [to_engine(w.cluster, a) for a in held], _ts(k.admitted_at),
                      deadline=k.stop_at(), borrowed=k.borrowed,
                      preempted_by=frozenset(k.preemptors or ()), stopping=_stopping(k))
    except Exception as exc:  # noqa: BLE001 - one job's bad data must not stop the pass
        w.broken[k.id] = {a.host for a in held if a.host in w.cluster.by_name}
        w.failed.add(k.id)
        later.append(lambda s, exc=exc: passerrors.live_job(svc, s, sched.state, w.cluster,
                                                            k, held, exc))


def _stopping(k: Known) -> tuple[str, float] | None:
    if k.state == "preempting" and k.preempt_deadline_at:
        return k.preempted_by, _ts(k.preempt_deadline_at)
    return None


def _hosts(state: ClusterState, old: Hosts, new: Hosts) -> None:
    """Change `state` host by host from what `old` said to what `new` says."""
    for name in old.drained.keys() | new.drained.keys():
        if name not in new.drained:
            state.set_drained(name, False)
            state.drain_reasons.pop(name, None)
        elif name not in old.drained or old.drained[name] != new.drained[name]:
            if name not in old.drained:
                state.set_drained(name)
            state.drain_reasons[name] = new.drained[name]
    for name in old.bad.keys() | new.bad.keys():
        if old.bad.get(name) != new.bad.get(name):
            state.set_unhealthy_gpus(name, list(new.bad.get(name, ())))
    for name in old.worn.keys() | new.worn.keys():
        if old.worn.get(name) != new.worn.get(name):
            state.set_degraded_gpus(name, new.worn.get(name, {}))
