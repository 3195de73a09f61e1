"""When a waiting job will start, where the answer is not "when resources free up": it
will preempt once its victims have run `min_run_time` (reclaim or a priority rule), or
it waits for its team's quota until the team's own jobs free enough. Only for reasons
(`explain` passes), and each pass looks for preemptions to come for its first 16
blocked jobs only (each search costs placements); the decisions stay preempt.py's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..units import format_duration
from .quota import most, need
from .victims import candidates, reclaims, soon_pool
from .victimsets import Trial

if TYPE_CHECKING:
    from .types import PassView, Pending, QueuedJob


def upcoming(p: PassView, job: QueuedJob, why: Pending, own_team: bool = False) -> Pending:
    """`why` with the preemption to come when it starts the job before `why.eta` does;
    for a `Quota` wait (`own_team`), its ETA first: when the team frees enough."""
    if not p.explain or p.mode == "count":
        return why
    if own_team:
        quota_eta(p, job, why)
    s, now = p.s, p.now
    cfg = s.config.preemption
    if cfg.min_run_time <= 0 or not (cfg.rules or reclaims(s, job, own_team)):
        return why
    r = p.reasons
    # a kind of job that finds no victims to come finds none again this pass, if it
    # runs as long or longer (see preempt.preempt)
    key = (job.shape, job.team, job.base, job.job_class, job.preempted_by, own_team,
           p.late(job))
    if job.runtime >= r.no_victims_soon.get(key, math.inf):
        return why
    if r.soon_pool is None:
        r.soon_pool = soon_pool(s, now, p.victim_pool, [j for j, _ in p.result.started])
    soon = r.soon_pool
    # the pool is sorted by when each may be stopped: the last is the latest
    if not soon or soon[-1][0][0] <= now:
        return why                  # every candidate may be stopped now: preempt() said no
    if r.searches_left <= 0:
        return why                  # a pass looks for this for its first jobs only
    r.searches_left -= 1
    taken = r.will_preempt                  # each victim is promised to one job only
    cands = [c for c in candidates(p, job, own_team, victims=soon) if c[1].name not in taken]
    try:
        trial = Trial(p, job, [], own_team)
        # one placement with all of them stopped says whether any set can do (most of
        # the searches fail, and a failing search tries up to max_victims placements)
        got = trial.cheapest(cands, cfg.max_victims) if cands and trial.place(
            [c[1] for c in cands]) else None
        if got is None and trial.skipped and reclaims(s, job, own_team):
            got = trial.cheapest(cands, cfg.max_victims, strict=False)
    finally:
        p.plan.hold_first(0)
    if got is None:
        r.no_victims_soon[key] = min(job.runtime, r.no_victims_soon.get(key, math.inf))
        return why
    chosen = got[0]
    at = max(c[0][0] for c in chosen)
    start = at + max(c[1].preempt_grace for c in chosen)
    waited = now - job.submit
    if at <= now or (why.eta is not None and (
            why.eta <= start - now or waited + why.eta < cfg.min_saved_wait)):
        return why                  # it starts as soon without, or saves too little
    names = [c[1].name for c in chosen]
    reason = "/".join(sorted({c[2] for c in chosen}))
    they = "it has" if len(names) == 1 else "they have"
    why.message = (f"will preempt {', '.join(names)} ({reason}) once {they} run "
                   f"min_run_time ({format_duration(cfg.min_run_time)}), and start when "
                   f"{they} stopped; until then: {why.message}")
    why.details.update(will_preempt=names, preempt_reason=reason)
    taken.update(names)
    why.eta = start - now
    return why


def quota_eta(p: PassView, job: QueuedJob, why: Pending) -> None:
    """A `Quota` wait's ETA: when the team's running jobs, ending as expected, have
    freed enough for the job to fit its team's limit (GPUs, CPUs, memory)."""
    s = p.s
    held = s.quotas.held.get(job.team, (0, 0, 0))
    over = [h + n - cap for h, n, cap in zip(
        held, need(job), most(s.config, job.team, job.preemptible), strict=True)]
    ends = sorted((s.state.expected_end[n], n) for n, j in s.running.items()
                  if j.team == job.team and j.spec.reservation is None)  # on no quota
    for end, name in ends:
        if all(x <= 0 for x in over):
            break
        over = [x - n for x, n in zip(over, need(s.running[name]), strict=True)]
        if all(x <= 0 for x in over):
            why.eta = max(0.0, end - p.now)
            why.message += f"; enough of it is expected back when job {name} ends"
            why.details["quota_frees_with"] = name
            return
