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
not needed is dropped again;
the same on each host alone, and the cheapest set wins. Who may be stopped: victims.py.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.placement import Placed
from ..units import format_duration
from .guarantee import (
    below,
    broken_guarantees,
    still_broken,
    stopping_by_team,
    taken_by_team,
)
from .quota import need
from .reservations import Reservation, earliest_end, place_best
from .types import Pending
from .victims import candidates, lost_seconds, reclaims
from .victims import pool as pool  # upcoming.py imports it from here
from .victims import unsaved as unsaved  # simulation/progress.py imports it from here

if TYPE_CHECKING:
    from .types import PassView, QueuedJob

HOST_SCOPES = 16          # hosts tried alone for a job that fits on one
EXHAUSTIVE = 10           # up to this many candidates, every set of them is tried


@dataclass
class Preemption:
    victim: QueuedJob
    by: QueuedJob
    reason: str            # "priority" | "reclaim"
    message: str
    stop_at: float         # the victim is gone by then: the signal, then its grace
    broken: str = ""       # whose guarantee it breaks, for whom (guarantee.py)


class Trial:
    """Places the job with some running jobs' resources given back (then taken again),
    around the pass's reservations that start before it would end."""

    def __init__(self, p: PassView, job: QueuedJob, freed: list[QueuedJob],
                 own_team: bool = False):
        self.p, self.job = p, job
        self.freed = freed         # stopping already for this job: free for every trial
        self.own_team = own_team   # the victims must also free the team's quota for it
        self.skipped = False       # a candidate was left out to keep a guarantee
        # inside `giving_back`: the jobs whose resources are given back now
        self.out: dict[QueuedJob, list] | None = None

    @functools.cached_property
    def gone(self) -> dict[str, list[float]]:
        """What each team's stopping jobs give back (guarantee.stopping_by_team)."""
        victims = self.p.victim_pool
        return victims.gone(self.p.s) if victims is not None else stopping_by_team(self.p.s)

    def shortfall(self, chosen) -> dict[str, float]:
        """Per other team: GPUs the victims take it below its guarantee (guarantee.below)."""
        taken = taken_by_team(self.job, [c[1] for c in chosen])
        quotas = self.p.s.quotas
        return {t: below(quotas, t, u, self.gone.get(t, (0, 0, 0))) for t, u in taken.items()}

    def quota_ok(self, victims: list[QueuedJob]) -> bool:
        return not self.own_team or self.p.s.quotas.fits_without(self.job, victims)

    @contextlib.contextmanager
    def giving_back(self):
        """Between the placements of one search, victims' resources stay given back:
        each placement gives back or takes again only those its set changes (the state
        it sees is the same); all are taken again at the end."""
        self.out = {}
        try:
            yield
        finally:
            self._take_again(list(self.out))
            self.out = None

    def _take_again(self, jobs) -> None:
        state = self.p.s.state
        for job in jobs:
            for a in self.out.pop(job):
                state.hold(a)

    def _too_few_gpus(self, victims: list[QueuedJob]) -> bool:
        """place_best's first test (could_fit, GPU counts) would fail with the resources
        of `victims` given back: only their hosts change."""
        state, job = self.p.s.state, self.job
        masks: dict[int, int] = {}                   # per host: GPUs coming back
        for v in victims:
            for a in state.allocations[v.name]:
                if a.gpu_mask:
                    masks[a.host.index] = masks.get(a.host.index, 0) | a.gpu_mask
        total, changed = state.usable_total, []      # usable GPUs before and after, per host
        for i, more in masks.items():
            hs = state.hosts[i]
            before = hs.usable_gpus.bit_count()
            after = 0 if hs.drained else ((hs.free_gpus | more) & ~hs.bad_gpus).bit_count()
            changed.append((before, after))
            total += after - before
        return total < job.gpus or any(
            state.replica_capacity(n.gpus) + sum(a // n.gpus - b // n.gpus for b, a in changed)
            < n.replicas for n in job.needs if n.gpus)

    def _give_back(self, victims: list[QueuedJob]) -> list | None:
        """Give back the resources of `freed` and `victims` (only theirs): what to take
        again after the placement ([] inside `giving_back`); None: no placement can be."""
        p, state = self.p, self.p.s.state
        if self.out is None:
            p.plan.hold_first(len(p.reservations))
            if self._too_few_gpus(self.freed + victims):
                return None
            allocs = [a for v in self.freed + victims for a in state.allocations[v.name]]
            for a in allocs:
                state.unhold(a)
            return allocs
        if not p.plan.holds_all():       # holds are grabbed with every victim running
            self._take_again(list(self.out))
        p.plan.hold_first(len(p.reservations))
        now = dict.fromkeys(self.freed + victims)
        adding = [v for v in now if v not in self.out]
        # a search mostly adds: then every victim given back is still in the set
        back = ([v for v in self.out if v not in now]
                if len(now) - len(adding) < len(self.out) else [])
        # given back even when too few GPUs come free (place_best's first test fails
        # then): a search adds candidates one by one, so each is given back once, not
        # counted again at every step until enough are
        self._take_again(back)
        for v in adding:
            self.out[v] = allocs = state.allocations[v.name]
            for a in allocs:
                state.unhold(a)
        return []

    def place(self, victims: list[QueuedJob]) -> Placed | None:
        p, s, job = self.p, self.p.s, self.job
        if not self.quota_ok(victims):
            return None
        state = s.state
        allocs = self._give_back(victims)
        if allocs is None:
            return None
        try:
            got = place_best(job, state, s.reg, s.best_tier(job))
        finally:
            for a in allocs:
                state.hold(a)
        if got is None:
            return None
        end = p.now + s.runtime(job, got.tier)
        if p.plan.blocks(got.allocations, end):
            return None          # it would take what a reservation needs before it ends
        return got

    def cheapest(self, cands: list[tuple[tuple, QueuedJob, str]], limit: int,
                 strict: bool = True
                 ) -> tuple[list[tuple[tuple, QueuedJob, str]], Placed] | None:
        """Add candidates cheapest first until the job places, then drop each one not
        needed (most expensive first); None if even `limit` of them do not free enough.
        A victim that would take another team below its guarantee is left out; unless
        not `strict` and it is reclaimed (a gang stops whole: see `preempt`)."""
        chosen: list[tuple[tuple, QueuedJob, str]] = []
        freed_gpus = self.p.plan.usable_total() + sum(v.gpus for v in self.freed)
        quotas, taken = self.p.s.quotas, {}
        got = None
        with self.giving_back():
            for c in cands:
                _, v, reason = c
                if v.team != self.job.team:
                    more = [a + b for a, b in zip(taken.get(v.team, (0, 0, 0)), need(v),
                                                  strict=True)]
                    if (strict or reason != "reclaim") and below(
                            quotas, v.team, more, self.gone.get(v.team, (0, 0, 0))):
                        self.skipped = True
                        continue
                    taken[v.team] = more
                chosen.append(c)
                freed_gpus += v.gpus
                if freed_gpus < self.job.gpus:
                    continue                  # not enough GPUs by count yet: no placement
                got = self.place([x[1] for x in chosen])
                if got is not None or len(chosen) >= limit:
                    break
            if got is None:
                return None
            for c in sorted(chosen, key=lambda c: c[0], reverse=True):
                if len(chosen) == 1:
                    break
                rest = [x for x in chosen if x is not c]
                fewer = self.place([x[1] for x in rest])
                if fewer is not None:
                    chosen, got = rest, fewer
        return chosen, got

    def every_set(self, cands: list[tuple[tuple, QueuedJob, str]], limit: int
                  ) -> tuple[list[tuple[tuple, QueuedJob, str]], Placed] | None:
        """Every set of up to EXHAUSTIVE candidates, those keeping every other team at its
        guarantee first, then those taking the fewest GPUs below one (reclaim only), each
        cheapest first: the first that places."""
        if self.place([c[1] for c in cands]) is None:
            return None                   # not even all of them free enough
        free = self.p.plan.usable_total() + sum(v.gpus for v in self.freed)
        sets = []
        for mask in range(1, 1 << len(cands)):
            chosen = [c for i, c in enumerate(cands) if mask >> i & 1]
            if len(chosen) > limit or free + sum(c[1].gpus for c in chosen) < self.job.gpus:
                continue
            short = self.shortfall(chosen)
            if any(short.get(c[1].team) and c[2] != "reclaim" for c in chosen):
                continue                  # priority never takes a guarantee
            sets.append(((sum(short.values()), *_total(chosen)), chosen))
        sets.sort(key=lambda s: s[0])
        with self.giving_back():
            for _, chosen in sets:
                got = self.place([c[1] for c in chosen])
                if got is not None:
                    return chosen, got
        return None


def _total(chosen) -> tuple:
    return (sum(c[0][0] for c in chosen), len(chosen), sum(c[0][1] for c in chosen))


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
    key = (job.shape, job.team, job.base, job.job_class, job.preempted_by, own_team)
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


def search(trial: Trial, cands: list[tuple[tuple, QueuedJob, str]], limit: int
           ) -> tuple[list[tuple[tuple, QueuedJob, str]], Placed] | None:
    """The cheapest set keeping every other team at its guarantee: over all candidates,
    and (for a job that fits on one host) over the candidates of each host alone."""
    s, job = trial.p.s, trial.job
    best = trial.cheapest(cands, limit)
    if best is None or job.gpus > s.state.cluster.max_host_gpus:
        return best
    # hosts by their cheapest candidate (cands are cheapest first): only those where it
    # costs less than the best set, since no set there can cost less otherwise
    victims, bound = trial.p.victim_pool, _total(best[0])[0]
    by_host: dict[int, list] = {}
    for c in cands:
        if c[0][0] >= bound or len(by_host) == HOST_SCOPES:
            break
        host = victims.one_host(s, c[1].name)
        if host is not None:
            by_host.setdefault(host, [])
    if by_host:
        for c in cands:
            host = victims.one_host(s, c[1].name)
            if host in by_host:
                by_host[host].append(c)
    for host, cs in by_host.items():
        if cs[0][0][0] >= _total(best[0])[0]:
            break
        free = s.state.hosts[host].usable_gpus.bit_count()
        if free + sum(c[1].gpus for c in cs) < job.gpus:
            continue
        got = trial.cheapest(cs, limit)
        if got is not None and _total(got[0]) < _total(best[0]):
            best = got
    return best


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
            if j.team == job.team and n not in s.stopping]
    return min(ends) - p.now if ends else None


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
