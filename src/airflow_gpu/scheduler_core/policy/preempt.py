"""Preemption: which running jobs a pending job may stop so that it starts now, and the
cheapest set of them that frees a valid placement for it (policy `preemption`).

- reclaim: a job its team's guarantee covers (and whose team has a GPU guarantee) stops
  borrowed work: jobs started beyond their team's guarantee, of teams still over it;
- priority: a rule lets the job's band (or class) stop jobs of lower bands, of its own
  team or borrowed: priority never takes another team's guarantee.

Either way the victims are preemptible jobs that have run `min_run_time`, none of them a
job that once preempted the preemptor (no ping-pong), and nothing is stopped for a job
whose wait (so far, plus what it still expects) stays within `min_saved_wait`. The cost
of a victim is the GPU-seconds it loses (since its last checkpoint), then its band, then
the latest start: candidates are added cheapest first until the job places, then each one
not needed is dropped again; the same on each host alone, and the cheapest set wins
(victimsets.py). Who may be stopped: victims.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.placement import Placed
from ..units import format_duration
from .guarantee import broken_guarantees, still_broken
from .reservations import Reservation, earliest_end
from .types import Pending
from .victims import candidates, lost_seconds, reclaims
from .victims import unsaved as unsaved  # simulation/progress.py imports it from here
from .victimsets import EXHAUSTIVE, Trial, search

if TYPE_CHECKING:
    from .types import PassView, QueuedJob


@dataclass
class Preemption:
    victim: QueuedJob
    by: QueuedJob
    reason: str            # "priority" | "reclaim"
    message: str
    stop_at: float         # the victim is gone by then: the signal, then its grace
    broken: str = ""       # whose guarantee it breaks, for whom (guarantee.py)


def preempt(p: PassView, job: QueuedJob, own_team: bool = False) -> Pending | None:
    """Stop the cheapest set of jobs that lets `job` start now, if the policy allows
    it: they are marked stopping (`Scheduler.stop`), the job waits for them with a
    reservation on the placement found. Returns its pending reason, or None.
    `own_team`: the job waits for its team's quota, so only lower bands of its own team
    may make room (Slurm's QOS preemption inside a GrpTRES limit)."""
    s, now = p.s, p.now
    # what failed once fails again this pass for a job of the same kind that runs as
    # long or longer: preemptions only take candidates away (victims stopping) and add
    # holds, and a longer job overlaps more reservations
    key = (job.shape, job.team, job.base, job.job_class, job.preempted_by, own_team,
           p.late(job))
    if job.runtime >= p.cannot_preempt.get(key, math.inf):
        return None
    cands = candidates(p, job, own_team)
    limit = s.config.preemption.max_victims
    trial = Trial(p, job, [], own_team)
    best = search(trial, cands, limit) if cands else None
    if best is None and trial.skipped:
        # every set that frees enough takes some team below its guarantee: a gang
        # stops whole, so its guaranteed part goes with its borrowed part
        best = (trial.every_set(cands, limit) if len(cands) <= EXHAUSTIVE
                else trial.cheapest(cands, limit, strict=False)
                if reclaims(s, job, own_team) else None)
    if best is None:
        p.cannot_preempt[key] = min(job.runtime, p.cannot_preempt.get(key, math.inf))
        return None
    chosen, placed = best
    # the job's whole wait, had so far and still expected: the estimate only knows the
    # reservations, not every job ahead of it, so time already waited counts too (and
    # the estimate, a walk, is only needed for a job that has not waited long)
    waited, wait = now - job.submit, None
    if waited < s.config.preemption.min_saved_wait:
        wait = _team_frees(p, job) if own_team else _wait_without(p, job)
        if wait is not None and waited + wait < s.config.preemption.min_saved_wait:
            return None
    return stop_for(p, job, chosen, placed, wait)


def _wait_without(p: PassView, job: QueuedJob) -> float | None:
    """How long the job would wait without preempting (None: no start is planned)."""
    s = p.s
    p.plan.hold_first(0)
    r = earliest_end(job, s.state, s.reg, p.now, p.reservations,
                     lambda tier: s.runtime(job, tier), s.best_tier(job))
    return None if r is None else r.start - p.now


def _team_frees(p: PassView, job: QueuedJob) -> float | None:
    """How long until the first of the team's running jobs is expected to end (what a
    job waiting for its team's quota waits for at least)."""
    s = p.s
    ends = [s.state.expected_end[n] for n, j in s.running.items()
            if j.team == job.team and n not in s.stopping
            and j.spec.reservation is None]        # a reservation's jobs free no quota
    return min(ends) - p.now if ends else None


def _must_start(dt: float) -> str:
    return (f"it should have started {format_duration(-dt)} ago" if dt < 0
            else f"it must start within {format_duration(dt)}")


def stop_for(p: PassView, job: QueuedJob, chosen, placed: Placed,
             wait: float | None) -> Pending:
    s, now = p.s, p.now
    names, reasons = [], set()
    stop_at = now
    broken, teams = broken_guarantees(p, job, chosen, placed, p.victim_pool.gone(s))
    for _, v, reason in chosen:
        lost = lost_seconds(v, s.state.started[v.name], now)
        why = ("reclaims its team's guaranteed GPUs from borrowed work" if reason == "reclaim"
               else f"priority band {job.base:g} preempts band {v.base:g}")
        if reason != "reclaim" and s.config.preemption.victims_below(
                job.base, job.job_class) <= v.base:       # only a rule on_deadline allows it
            why = (f"its deadline is at risk: {_must_start(job.latest_start - now)} to end "
                   f"its pipeline in time, and a rule on_deadline lets its band "
                   f"{job.base:g} preempt band {v.base:g} work without a deadline")
        note = broken.get(v.name, "")
        msg = (f"preempted by job {job.name} ({reason}: {why}{f'; {note}' if note else ''}"
               f"); {v.preempt_signal}, then SIGKILL after {v.preempt_grace:g}s; about "
               f"{format_duration(lost)} of work since its last checkpoint is lost; "
               "requeued under the same id")
        at = s.stop(v, job, now)
        p.result.preempted.append(Preemption(v, job, reason, msg, at,
                                             teams.get(v.team, "") if note else ""))
        stop_at = max(stop_at, at)
        names.append(v.name)
        reasons.add(reason)
    s.claims[job.name] = names
    return claim_wait(p, job, names, placed, stop_at, "/".join(sorted(reasons)), wait,
                      teams)


def claim_wait(p: PassView, job: QueuedJob, victims: list[str], placed: Placed,
               stop_at: float, reason: str = "", wait: float | None = None,
               broken: dict[str, str] | None = None) -> Pending:
    """The preemptor waits for its victims to stop, its placement reserved from then on
    (so that nothing else takes the part of it that is free now); `broken`: the teams it
    takes below their guarantee (guarantee.py)."""
    s, now = p.s, p.now
    end = stop_at + s.runtime(job, placed.tier)
    p.add(Reservation(job, stop_at, end, placed.allocations, placed.tier, protected=True))
    details = {"victims": victims}
    if reason:
        details["preempt_reason"] = reason
    saved = "" if wait is None else f"; it would otherwise wait {format_duration(wait)}"
    if broken:
        saved += "; " + "; ".join(broken.values())
        details["guarantee_broken"] = sorted(broken)
    return Pending("Preempting", (
        f"preempting {', '.join(victims)}{f' ({reason})' if reason else ''}: starts when "
        f"they have stopped, at the latest in {format_duration(max(0, stop_at - now))}"
        + saved), details, max(0.0, stop_at - now))


def claimed(p: PassView, job: QueuedJob) -> Pending | None:
    """A job that preempted others in an earlier pass and has not started: while its
    victims are still stopping it waits for them; once they are all gone the claim ends
    (None: the job is considered like any other, and may preempt again)."""
    s = p.s
    victims = [n for n in s.claims.get(job.name, ()) if n in s.stopping]
    if not victims:
        s.claims.pop(job.name, None)
        return None
    trial = Trial(p, job, [s.running[n] for n in victims])
    placed = trial.place([])
    if placed is None:
        s.claims.pop(job.name, None)
        return None
    stop_at = max(s.state.expected_end[n] for n in victims)
    return claim_wait(p, job, victims, placed, stop_at,
                      broken=still_broken(s, job, [s.running[n] for n in victims]))
