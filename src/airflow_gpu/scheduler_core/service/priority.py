"""The queue as the scheduler sees it, for Slurm's squeue, sprio and sshare habits.

Each view builds the scheduler the way the next pass does (storepass.py): the fair-share
usage of ended and live jobs (`past_usage`), the pending jobs that are not held queued with
their specs (`job_spec`), and asks it for its order and its terms (`Scheduler.priorities`,
`JobQueue.terms`, `FairShare.terms`): no second formula."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select

from ..engine.state import ClusterState
from ..policy.config import PolicyConfig
from ..policy.fairshare import FairShare
from ..policy.jobqueue import QueuedJob
from ..policy.scheduler import Scheduler
from ..policy.types import account, team_of
from ..store.models import JobRow
from .arrays import compact_pending
from .common import WAIT_CODES
from .core import ENDED, LIVE, PENDING, Service, _ts, utcnow
from .idle import queue_entry
from .jobcontrol import HELD, blocker_ids, name_jobs, names_of
from .leaderview import leader_engine
from .storepass import job_spec, past_usage

# what the views show of a pending or live job (BUILD too, where a scheduler is built)
SHOWN = (JobRow.id, JobRow.name, JobRow.team, JobRow.user, JobRow.state,
         JobRow.priority, JobRow.submitted_at, JobRow.queued_at, JobRow.admitted_at,
         JobRow.reason_code, JobRow.blocked, JobRow.array_id, JobRow.array_index,
         JobRow.requeue_reason)
BUILD = (JobRow.spec, JobRow.preemptors, JobRow.details)     # what a scheduler built reads


@dataclass
class Snapshot:
    """The queue as the scheduler orders it, and the pending and live jobs (SHOWN's
    columns, submit order)."""
    now: float
    order: list[tuple[QueuedJob, bool, dict[str, float]]]   # Scheduler.priorities
    config: PolicyConfig
    claims: set[str]                            # preemptors, considered first
    urgent: float                               # Scheduler.urgent_before
    fairshare: FairShare
    accounts: set[str]                          # those with jobs queued
    pending: list                               # every pending job
    live: list
    skipped: dict[str, str | None] = field(default_factory=dict)  # not queued: why


def snapshot(svc: Service) -> Snapshot:
    """Where this replica leads, the order of the leader's own engine, brought up to
    date with the store as asked (leaderview.py), with jobs submitted since not queued
    yet; elsewhere the scheduler is built as the next pass will build it (without the
    cluster's state: the order does not depend on it)."""
    t_now = _ts(utcnow())
    lead = None
    w = leader_engine(svc)
    if w is not None:
        with svc.state_lock:
            if w.sched is not None:
                lead = _terms(w.sched, t_now), set(w.sched.queue.jobs)
    rows = _rows(svc, spec=lead is None)
    pending = [r for r in rows if r.state == PENDING]
    live = [r for r in rows if r.state != PENDING]
    skipped = {r.id: r.reason_code or WAIT_CODES[r.blocked] for r in pending
               if r.reason_code in HELD or r.blocked}   # as the pass, which never sees them
    if lead is None:
        snap = _built(svc, t_now, [r for r in pending if r.id not in skipped], live, skipped)
    else:
        snap, queued = lead
        skipped.update((r.id, r.reason_code) for r in pending    # submitted since
                       if r.id not in skipped and r.id not in queued)
    ids = {r.id for r in pending if r.id not in skipped}   # jobs gone since: left out
    snap.order = [o for o in snap.order if o[0].name in ids]
    snap.pending, snap.live, snap.skipped = pending, live, skipped
    return snap


def _rows(svc: Service, spec: bool) -> list:
    """The pending and live jobs in submit order (SHOWN, and BUILD where a scheduler is
    built): one statement, since read apart a job admitted in between (PostgreSQL reads
    each statement's own snapshot) would be in neither list."""
    with svc.reads() as s:                  # Core rows: cheaper than the ORM's
        return list(s.connection().execute(select(*SHOWN, *(BUILD if spec else ())).where(
            JobRow.state.in_((*LIVE, PENDING))).order_by(JobRow.submitted_at, JobRow.id)))


def _built(svc: Service, t_now: float, queued: list, live: list,
           skipped: dict[str, str | None]) -> Snapshot:
    """The terms of a scheduler built as the next pass builds it, from the `queued` jobs
    (those it cannot take in added to `skipped`) and the `live` ones' fair-share usage."""
    sched = Scheduler(ClusterState(svc.cluster), svc._policy(), svc.reg, now=t_now)
    with svc.reads() as s:
        past_usage(svc, s, sched.fairshare, t_now, live)
    for row in queued:
        try:
            at, behind = queue_entry(row)      # as the pass queues it (idle.py)
            sched.submit(job_spec(row), at,
                         preempted_by=frozenset(row.preemptors or ()), behind=behind)
            if row.reason_code == "Preempting":     # the pass considers it first
                sched.claims[row.id] = list(row.details.get("victims", ()))
        except Exception as exc:     # rejected, or a spec the pass cannot read either
            skipped[row.id] = row.reason_code or type(exc).__name__
    return _terms(sched, t_now)


def _terms(sched: Scheduler, now: float) -> Snapshot:
    """What the views take of a scheduler (the rows come after)."""
    return Snapshot(now, sched.priorities(now), sched.config, set(sched.claims),
                    sched.urgent_before(now), sched.fairshare, set(sched.queue.accounts),
                    [], [])


def _num(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def priorities(svc: Service, team: str | None = None, user: str | None = None) -> dict:
    """Each pending job's priority factors, in the order the scheduler considers them
    (Slurm's sprio): its band (priority + job-class weight; strict) and its score within
    the band (fair share + size + age points), whether it is protected by the wait
    guarantee, then the held jobs and those the scheduler does not queue."""
    snap = snapshot(svc)
    cfg = snap.config
    rows = {r.id: r for r in snap.pending}
    out = []
    urgent = snap.urgent
    # whose deadlines may preempt (rules on_deadline): the policy's, per team
    on_deadline = any(r.on_deadline for r in cfg.preemption.rules)
    for rank, (job, protected, terms) in enumerate(snap.order, 1):
        row = rows[job.name]
        if team and row.team != team or user and row.user != user:
            continue
        out.append({
            "rank": rank, "id": row.id, "name": row.name, "team": row.team, "user": row.user,
            "job_class": job.job_class, "priority": job.spec.priority,
            "class_weight": round(job.base - job.spec.priority, 6), "band": job.base,
            "protected": protected, "preempting": job.name in snap.claims,
            "behind": job.behind,      # requeued as idle: after its band's other jobs
            "fairshare": round(terms["fairshare"], 6), "size_factor": round(job.size, 6),
            "size": round(terms["size"], 6), "age_hours": round((snap.now - job.submit)
                                                                / 3600.0, 6),
            "age": round(terms["age"], 6), "score": round(terms["score"], 6),
            "gpus": job.gpus, "expected_runtime_s": _num(job.runtime),
            "time_limit_s": _num(job.limit),
            "submitted_at": row.submitted_at, "code": row.reason_code,
            # its pipeline's deadline (slack.py): when it must start, and whether it goes
            # ahead of its band for it now
            "latest_start_at": _iso(job.latest_start) if job.latest_start < math.inf
            else None, "slack_s": _num(job.latest_start - snap.now),
            "deadline_first": job.latest_start < urgent,
            "deadline_preempts": cfg.deadline_preempts(row.team)
            if on_deadline and job.latest_start < math.inf else None})
    later = [{"rank": None, "id": r.id, "name": r.name, "team": r.team, "user": r.user,
              "priority": r.priority, "code": snap.skipped[r.id],
              "submitted_at": r.submitted_at}
             for r in snap.pending if r.id in snap.skipped and (not team or r.team == team)
             and (not user or r.user == user)]
    return {"mode": cfg.mode,
            "weights": {"fairshare": cfg.fairshare_weight, "size": cfg.size_weight
                        if cfg.mode == "backfill" else 0.0, "age": cfg.age_weight},
            "reserve_after_s": cfg.reserve_after,
            "reserve_after_scale": cfg.reserve_after_scale,
            "deadline_slack_s": cfg.deadline_slack, "on_deadline_rule": on_deadline,
            "jobs": out,
            "not_queued": later}


def shares(svc: Service) -> list[dict]:
    """Each team's fair share (Slurm's sshare): its configured and normalized share, its
    decayed GPU usage and its part of all usage, the fair-share factor and the priority
    points it gives its jobs, its quota and what it holds, its jobs pending and live and
    the most it may have (max_submit_jobs, none: no limit) (GET /api/v1/teams); under
    it, `users`: the same for each user of the team (the tree's second level, whose
    normalized shares split the team's)."""
    snap = snapshot(svc)
    fs = snap.fairshare
    teams = svc.teams()
    policy = snap.config
    accounts = snap.accounts | set(fs.usage)
    names = set(teams) | {team_of(a) for a in accounts} | set(policy.teams)
    team_terms = fs.team_terms(names)
    user_terms = fs.terms({a for a in accounts if "/" in a}
                          | {a for a in accounts if _has_users(a, accounts)})
    pending: dict[str, int] = {}
    for r in snap.pending:
        pending[account(r.team, r.user)] = pending.get(account(r.team, r.user), 0) + 1
    running: dict[str, int] = {}
    for r in snap.live:
        running[account(r.team, r.user)] = running.get(account(r.team, r.user), 0) + 1
    weight = policy.fairshare_weight
    used = fs.team_usage()

    def line(usage_share: float, share_norm: float, points: float, gpu_s: float) -> dict:
        return {"share_norm": round(share_norm, 6),
                "usage_gpu_hours": round(gpu_s / 3600.0, 6),
                "usage_norm": round(usage_share, 6),
                "fairshare_factor": round(points / weight, 6) if weight else
                round(2.0 ** (-usage_share / share_norm), 6) if share_norm else 0.0,
                "fairshare_points": round(points, 6)}

    out = []
    for name in sorted(names):
        t = teams.get(name) or {"name": name, "share": policy.share(name),
                                "quota_gpus": policy.quota(name), "borrow_gpus": None,
                                "held_gpus": 0, "borrowed_gpus": 0, "lent_gpus": 0,
                                "reservation_gpus": 0,
                                "error": None}
        users = [{"user": a.split("/", 1)[1] if "/" in a else None,
                  "share": policy.user_share(name, a.split("/", 1)[1] if "/" in a else None),
                  **line(*user_terms[a], fs.usage.get(a, 0.0)),
                  "pending_jobs": pending.get(a, 0), "live_jobs": running.get(a, 0),
                  "max_submit_jobs": policy.submit_limits(
                      name, a.split("/", 1)[1] if "/" in a else None)[1]}
                 for a in sorted(user_terms, key=lambda a: (a != name, a))
                 if team_of(a) == name]
        out.append({**t, **line(*team_terms[name], used.get(name, 0.0)),
                    "pending_jobs": sum(n for a, n in pending.items() if team_of(a) == name),
                    "live_jobs": sum(n for a, n in running.items() if team_of(a) == name),
                    "max_submit_jobs": policy.submit_limits(name, None)[0],
                    "users": users})
    return out


def _has_users(team: str, accounts: set[str]) -> bool:
    """A team's own account (its jobs that name no user) beside accounts of its users."""
    return "/" not in team and any(a.startswith(team + "/") for a in accounts)


def _iso(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def queue(svc: Service, all_jobs: bool = False, state: str | None = None,
          team: str | None = None, limit: int = 1000,
          user: str | None = None) -> list[tuple[JobRow, dict]]:
    """(job, what squeue shows beyond the job) in squeue's order: live jobs by start,
    then pending jobs in the scheduler's order, the held ones, those it does not queue
    (an array's elements waiting for their turn or a dependency: one entry, as squeue
    shows them), and with `all_jobs` (or an ended `state`) the ended jobs, newest
    first."""
    snap = snapshot(svc)
    rows = {r.id: r for r in snap.pending}
    out: list[tuple] = []
    for r in sorted(snap.live, key=lambda r: (_ts(r.admitted_at) if r.admitted_at else 0,
                                              _ts(r.submitted_at), r.id)):  # then by index
        out.append((r, {"rank": None}))
    for rank, (job, _protected, terms) in enumerate(snap.order, 1):
        out.append((rows[job.name], {"rank": rank, "band": job.base,
                                     "score": round(terms["score"], 6),
                                     "limit": job.limit}))
    out += [(r, {"rank": None}) for r in snap.pending if r.id in snap.skipped]
    out = compact_pending(svc, [(r, x) for r, x in out if (not state or r.state == state)
                                and (not team or r.team == team)
                                and (not user or r.user == user)])[:limit]
    ended: list[tuple[JobRow, dict]] = []
    if (all_jobs or (state and state not in (PENDING, *LIVE))) and len(out) < limit:
        q = select(JobRow).where(JobRow.state.in_(ENDED)).order_by(
            JobRow.finished_at.desc(), JobRow.id.desc()).limit(limit - len(out))
        if state:
            q = q.where(JobRow.state == state)
        if team:
            q = q.where(JobRow.team == team)
        if user:
            q = q.where(JobRow.user == user)
        with svc.reads() as s:
            ended = [(r, {"rank": None}) for r in s.scalars(q)]
    out = _whole(svc, out) + ended
    names = {i: f"{j.name} ({i[:8]})" for i, j in names_of(svc, [
        b for r, _ in out if r.state == PENDING for b in blocker_ids(r.details or {})]).items()}
    for r, extra in out:
        _fill(r, extra, snap.now, names)
    return out


def _whole(svc: Service, out: list[tuple]) -> list[tuple[JobRow, dict]]:
    """The shown jobs' whole rows, in one read (the queue is ordered on SHOWN's columns
    of every job; only those shown are read whole)."""
    ids = [r.id for r, _ in out]
    whole: dict[str, JobRow] = {}
    with svc.reads() as s:
        for i in range(0, len(ids), 1000):
            whole.update((r.id, r) for r in s.scalars(
                select(JobRow).where(JobRow.id.in_(ids[i:i + 1000]))))
    return [(whole[r.id], x) for r, x in out if r.id in whole]


def _fill(r: JobRow, extra: dict, now: float, names: dict[str, str]) -> None:
    """ETA (absolute and relative), elapsed and time limit: squeue's START_TIME, TIME and
    TIME_LIMIT."""
    limit = extra.pop("limit", None)
    start = _ts(r.admitted_at) if r.admitted_at else None
    end = _ts(r.finished_at) if r.finished_at else now
    extra["elapsed_s"] = None if start is None else round(max(0.0, end - start))
    if r.deadline_at and start is not None:
        extra["time_limit_s"] = round(_ts(r.deadline_at) - start)
    elif limit is not None:
        extra["time_limit_s"] = _num(limit)
    else:
        extra["time_limit_s"] = None
    pending = r.state == PENDING
    extra["eta_at"] = _iso(r.eta_at) if pending else None
    extra["eta_s"] = max(0, round(r.eta_at - now)) if pending and r.eta_at else None
    extra["reason"] = name_jobs(r.reason, names) if pending else None
