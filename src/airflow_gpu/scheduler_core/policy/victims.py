"""Who a preemption may stop (preempt.py decides which of them it does): the running jobs
that may be preempted at all, cheapest first, and those a pending job may stop by
reclaim or by priority; a pass keeps what it found of them for the jobs that follow.
"""

from __future__ import annotations

import itertools
import math
from operator import itemgetter
from typing import TYPE_CHECKING

from .guarantee import stopping_by_team

if TYPE_CHECKING:
    from .types import PassView, QueuedJob, SchedulerView


def unsaved(ran: float, interval: float | None) -> float:
    """Seconds of a run of `ran` seconds done since its last checkpoint (every `interval`
    seconds from its start; none: all of it)."""
    return ran % interval if interval else ran


def lost_seconds(job: QueuedJob, started: float, now: float) -> float:
    """Seconds of the job's work a stop now loses: since its last checkpoint."""
    return unsaved(max(0.0, now - started), job.checkpoint_interval)


class Pool(list):
    """(cost, job, name, team, borrowed, band) of running jobs that may be preempted,
    cheapest first (what `candidates` reads of a job, fixed while it runs, beside it: a
    scan reads no job objects), with what one pass keeps of it between searches: each
    kind of preemptor's candidates so far (`candidates`), each victim's host
    (`one_host`)."""

    def __init__(self, rows: list[tuple], young: list[QueuedJob] | None = None,
                 started: int = 0):
        super().__init__(rows)
        # what soon_pool adds: the preemptible jobs left out inside min_run_time, and
        # how many jobs the pass had started when it was made
        self.young, self.started = young or [], started
        # kind -> (teams over their guarantee, len(stopping), candidates by name,
        # where the scan stopped)
        self.kinds: dict[tuple, tuple] = {}
        self.hosts: dict[str, int | None] = {}
        self.guaranteed: dict[str, bool] = {}        # team -> it has a GPU guarantee
        self._gone: tuple[int, dict[str, list[float]]] = (0, {})

    def gone(self, s: SchedulerView) -> dict[str, list[float]]:
        """guarantee.stopping_by_team as a running total: in a pass, jobs only begin to
        stop (in the order `stopping` keeps)."""
        n, by_team = self._gone
        if n != len(s.stopping):
            by_team = (stopping_by_team(s, itertools.islice(s.stopping, n, None), by_team)
                       if n < len(s.stopping) else stopping_by_team(s))
            self._gone = (len(s.stopping), by_team)
        return by_team

    def one_host(self, s: SchedulerView, name: str) -> int | None:
        """The host a victim runs on, None if it spans several."""
        if name not in self.hosts:
            hosts = {a.host.index for a in s.state.allocations[name]}
            self.hosts[name] = hosts.pop() if len(hosts) == 1 else None
        return self.hosts[name]


def _cost(v: QueuedJob, started: float, now: float) -> tuple:
    """A victim's cost; lost_seconds inline: it runs for every running job."""
    ran, interval = max(0.0, now - started), v.checkpoint_interval
    return (max(v.gpus, 1) * (ran % interval if interval else ran), v.base, -started, v.seq)


def pool(s: SchedulerView, now: float, soon: bool = False, started: int = 0) -> Pool:
    """Every running job that may be preempted at all, cheapest first (Pool). `soon`:
    also those still inside `min_run_time`, the cost led by when they may be; `started`:
    how many jobs the pass has started so far (soon_pool)."""
    min_run, stopping, started_at = s.config.preemption.min_run_time, s.stopping, s.state.started
    rows, young = [], []
    for name, v in s.running.items():
        if name in stopping or not v.preemptible:
            continue
        at = started_at[name]
        if soon:
            rows.append(((max(now, at + min_run), *_cost(v, at, now)), v, name, v.team,
                         v.borrowed, v.base))
        elif now - at < min_run:
            young.append(v)
        else:
            rows.append((_cost(v, at, now), v, name, v.team, v.borrowed, v.base))
    rows.sort(key=itemgetter(0))
    return Pool(rows, young, started)


def soon_pool(s: SchedulerView, now: float, passed: Pool | None,
              started: list[QueuedJob]) -> Pool:
    """pool(s, now, soon=True), from the pass's pool (`passed`, made at `now`) where there
    is one: its jobs' costs stay (those stopping since drop out); only those it left out
    inside min_run_time and those the pass started since (`started`: all it started) are
    costed."""
    if passed is None:
        return pool(s, now, soon=True)
    min_run, stopping, started_at = s.config.preemption.min_run_time, s.stopping, s.state.started
    rows = [((max(now, -cost[2] + min_run), *cost), v, name, team, borrowed, base)
            for cost, v, name, team, borrowed, base in passed if name not in stopping]
    for v in itertools.chain(passed.young, started[passed.started:]):
        if v.name not in stopping and v.preemptible:
            at = started_at[v.name]
            rows.append(((max(now, at + min_run), *_cost(v, at, now)), v, v.name, v.team,
                         v.borrowed, v.base))
    rows.sort(key=itemgetter(0))
    return Pool(rows)


def reclaims(s: SchedulerView, job: QueuedJob, own_team: bool = False) -> bool:
    """The job may reclaim: its team's GPU guarantee covers it (not waiting for quota)."""
    return (s.config.preemption.reclaim and job.gpus > 0 and not own_team
            and s.quotas.guaranteed(job.team) and s.quotas.covered(job))


def candidates(p: PassView, job: QueuedJob, own_team: bool = False,
               victims: Pool | None = None) -> list[tuple[tuple, QueuedJob, str]]:
    """(cost, victim, reason) of every job `job` may stop, cheapest first, at most
    4 x max_victims; `own_team`: only its team's (it waits for its team's quota);
    `victims`: this pool, not the pass's."""
    s = p.s
    cfg = s.config.preemption
    below = cfg.victims_below(job.base, job.job_class, p.late(job))
    reclaim = reclaims(s, job, own_team)
    if below == -math.inf and not reclaim:
        return []
    if victims is None:
        if p.victim_pool is None:
            p.victim_pool = pool(s, p.now, started=len(p.result.started))
        victims = p.victim_pool
    quotas, stopping = s.quotas, s.stopping
    over = {t: quotas.over(t) for t in quotas.held}     # every running job's team
    guaranteed = victims.guaranteed                   # the policy's, fixed
    for t in over:
        if t not in guaranteed:
            guaranteed[t] = quotas.guaranteed(t)
    # within a pass jobs only start and victims only stop: while no team crosses its
    # guarantee, a kind's candidates are those found before less the victims stopping
    # since, then the scan goes on where it stopped
    kind = (job.team, below, reclaim, job.preempted_by, own_team)
    flags = tuple(over.values())
    found: dict[str, tuple] = {}          # name -> (cost, victim, reason), cheapest first
    pos = 0
    cached = victims.kinds.get(kind)
    if cached is not None and cached[0] == flags and cached[1] <= len(stopping):
        _, seen, found, pos = cached
        for name in itertools.islice(stopping, seen, None):
            found.pop(name, None)
    limit = cfg.max_victims * 4
    mine, preempted_by = job.team, job.preempted_by
    while len(found) < limit and pos < len(victims):
        cost, v, name, team, borrowed, base = victims[pos]
        pos += 1
        if name in stopping or name in preempted_by or own_team and team != mine:
            continue
        borrowed = borrowed and over[team]
        if reclaim and borrowed and team != mine:
            reason = "reclaim"
        elif base < below and (team == mine or borrowed or not guaranteed[team]) and (
                base < job.base or v.latest_start == math.inf):   # own band: see config
            reason = "priority"
        else:
            continue
        found[name] = (cost, v, reason)
    victims.kinds[kind] = (flags, len(stopping), found, pos)
    return list(found.values())
