"""Guarantees against preemption: what each team's victims take from it, and what a
reclaim says when it has to take a team below its guarantee.

A gang stops whole, so a job that is only partly borrowed (16 GPUs, 8 of them beyond its
team's guarantee) takes its guaranteed part with it. Reclaim prefers a set of victims
that keeps every team at or above its guarantee; only where none frees room does it stop
one that does not, and then says so (preempt.py, docs/queue-policy.md "Reclaim").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .quota import need
from .reservations import place_best

if TYPE_CHECKING:
    from ..engine.placement import Placed
    from .quota import Quotas
    from .types import PassView, QueuedJob, SchedulerView

BROKEN = "guarantee broken: "     # how a preemption message names it (service reads it)


def _plus(u, n) -> list[float]:
    return [a + b for a, b in zip(u or (0, 0, 0), n, strict=True)]


def below(quotas: Quotas, team: str, less, gone=(0, 0, 0)) -> float:
    """GPUs (else 1 for another resource) `team` is taken below its guarantee if `less`
    more of it stops, on top of `gone` (stopping already): 0 while it keeps, per resource,
    its guarantee, or what it holds where that is less."""
    u = quotas.held.get(team, (0, 0, 0))
    short = 0.0
    for i, (a, x, y, g) in enumerate(zip(u, less, gone, quotas.guarantee(team),
                                        strict=True)):
        if g == math.inf or x <= 0:
            continue
        lost = min(a - y, g) - (a - y - x)
        if lost > 0:
            short = max(short, float(lost) if i == 0 else 1.0)
    return short


def stopping_by_team(s: SchedulerView, names: Iterable[str] | None = None,
                     out: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """What each team's jobs that are stopping already give back; `names` (of them) on
    top of `out`: a running total."""
    out = {} if out is None else dict(out)
    for name in s.stopping if names is None else names:
        v = s.running.get(name)
        if v is not None:
            out[v.team] = _plus(out.get(v.team), need(v))
    return out


def taken_by_team(job: QueuedJob, victims: list[QueuedJob]) -> dict[str, list[float]]:
    """What `victims` of teams other than `job`'s hold, per team."""
    out: dict[str, list[float]] = {}
    for v in victims:
        if v.team != job.team:
            out[v.team] = _plus(out.get(v.team), need(v))
    return out


def _n(v: float) -> str:
    return f"{float(v):g}"


def broken_teams(s: SchedulerView, job: QueuedJob, victims: list[QueuedJob], gone=None
                 ) -> dict[str, str]:
    """Per team that stopping `victims` (on top of `gone`, per team: default, the jobs
    stopping already) takes below its guarantee: what the preemptor's reason says."""
    if gone is None:
        gone = stopping_by_team(s)
    out = {}
    for team, less in taken_by_team(job, victims).items():
        was = gone.get(team, (0, 0, 0))
        if below(s.quotas, team, less, was):
            held = s.quotas.held.get(team, (0, 0, 0))[0] - was[0] - less[0]
            out[team] = (f"{BROKEN}team {team!r} keeps {_n(held)} GPUs of its quota_gpus "
                         f"{_n(s.config.guarantee(team)[0])}, for job {job.name} of team "
                         f"{job.team!r}: a gang stops whole, and every set of borrowed jobs "
                         "that frees room for it takes some team below its guarantee")
    return out


def broken_guarantees(p: PassView, job: QueuedJob, chosen, placed: Placed, gone=None
                      ) -> tuple[dict[str, str], dict[str, str]]:
    """Per victim of a team the set takes below its guarantee, what its preemption says
    (whose guarantee, for whom, and whether it may restart on what is left); per such
    team, what the preemptor's reason says. `gone`: as broken_teams."""
    teams = broken_teams(p.s, job, [c[1] for c in chosen], gone)
    out = {}
    for _, v, _ in chosen:
        if v.team in teams:
            out[v.name] = teams[v.team] + (
                ", and this job may restart on what is left" if restarts(p, v, chosen, placed)
                else ", and what is left is too little for this job to restart on "
                f"({_n(v.gpus)} GPUs)")
    return out, teams


def still_broken(s: SchedulerView, job: QueuedJob, victims: list[QueuedJob]) -> dict[str, str]:
    """`broken_teams` of a preemptor whose victims are stopping already (a later pass)."""
    others = [n for n in s.stopping if n not in {v.name for v in victims}]
    gone: dict[str, list[float]] = {}
    for n in others:
        v = s.running.get(n)
        if v is not None:
            gone[v.team] = _plus(gone.get(v.team), need(v))
    return broken_teams(s, job, victims, gone)


def restarts(p: PassView, v: QueuedJob, chosen, placed: Placed) -> bool:
    """The victim would place again once all `chosen` have stopped and the preemptor
    holds its placement (reservations aside)."""
    s = p.s
    state = s.state
    p.plan.hold_first(0)
    freed = [a for c in chosen for a in state.allocations[c[1].name]]
    for a in freed:
        state.unhold(a)
    for a in placed.allocations:
        state.hold(a)
    try:
        return place_best(v, state, s.reg, s.best_tier(v)) is not None
    finally:
        for a in placed.allocations:
            state.unhold(a)
        for a in freed:
            state.hold(a)
