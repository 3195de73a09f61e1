"""The cheapest set of running jobs whose stop lets a pending job place now (preempt.py
decides whether it may stop them, victims.py who it may): placements with their
resources given back, candidates added cheapest first until the job places, then each
one not needed dropped again; the same on each host alone, and the cheapest set wins.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

from .guarantee import below, stopping_by_team, taken_by_team
from .quota import need
from .reservations import place_best

if TYPE_CHECKING:
    from ..engine.placement import Placed
    from .types import PassView, QueuedJob

HOST_SCOPES = 16          # hosts tried alone for a job that fits on one
EXHAUSTIVE = 10           # up to this many candidates, every set of them is tried


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


def search(trial: Trial, cands: list[tuple[tuple, QueuedJob, str]], limit: int
           ) -> tuple[list[tuple[tuple, QueuedJob, str]], Placed] | None:
    """The cheapest set keeping every other team at its guarantee: over all candidates,
    and (for a job that fits on one host) over the candidates of each host alone, unless
    no set of them can cost less than the best found (may_beat)."""
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
        if not may_beat(trial, cs, free, _total(best[0])):
            continue
        got = trial.cheapest(cs, limit)
        if got is not None and _total(got[0]) < _total(best[0]):
            best = got
    return best


def may_beat(trial: Trial, cs: list[tuple[tuple, QueuedJob, str]], free: int, best: tuple
             ) -> bool:
    """Whether a set of one host's candidates `cs` may cost less than `best` (its
    _total); False only where none can. A job of one replica that could not start without
    stopping jobs (search runs after Pass.try_now failed, holding fewer reservations)
    places on the host its victims free, and needs its GPUs there (`free` usable now):
    each set costs at least what it lacks times the least GPU-seconds any
    candidate loses per GPU; on a tie, the fewest candidates that free enough and then
    the lowest bands decide. Costs that are not whole numbers count only beyond float
    rounding (sums in another order)."""
    job = trial.job
    want = job.gpus - free
    if (want <= 0 or trial.own_team or trial.freed
            or sum(n.replicas for n in job.needs) != 1):
        return True
    gpus = [(c[0][0], c[1].gpus) for c in cs if c[1].gpus]
    if not gpus:
        return False
    cost, n, bands = best
    if not all(_whole(x) for x, _ in gpus) or not _whole(cost):
        return not all(want * x > cost * g * (1 + 1e-9) for x, g in gpus)
    # whole numbers: exact; the sign of want * (x / g) - cost, least first
    sign = min((want * int(x) > int(cost) * g) - (want * int(x) < int(cost) * g)
               for x, g in gpus)
    if sign:
        return sign < 0
    fewest, got = 0, 0
    for g in sorted((g for _, g in gpus), reverse=True):
        fewest, got = fewest + 1, got + g
        if got >= want:
            break
    if got < want:
        return False               # all of them free too few GPUs there
    if fewest != n:
        return fewest < n
    lowest = sorted(c[0][1] for c in cs)[:n]
    return not all(_whole(b) for b in lowest) or not _whole(bands) or sum(lowest) < bands


def _whole(x: float) -> bool:
    """A whole number small enough that sums of up to 10,000 of them are exact floats."""
    return float(x).is_integer() and abs(x) < 2**39
