"""GPU usage and fair share per team over a past window, derived from the scheduler's job
records (submitted, admitted and finished times, GPUs from the spec) rather than sampled,
so it survives restarts and is the same in every API server worker.

What it cannot know: quotas and share weights as they were (today's are used for the
whole window), jobs older than the records fetched (the newest N plus every pending
and live job), and admissions that ended in a requeue (a preempted job's record keeps
only its current admission)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ..format import parse_time
from .queue import job_gpus


@dataclass
class Series:
    """A team's step functions over the window: (time, value) points, oldest first."""
    held: list[tuple[float, float]] = field(default_factory=list)
    fair: list[tuple[float, float]] = field(default_factory=list)


def fair_shares(demand: dict[str, float], weights: dict[str, float],
                caps: dict[str, float | None], total: float) -> dict[str, float]:
    """Max-min fair shares by weight (water-filling): the GPUs are split by weight among
    the teams that want some; no team gets more than it asks for or may hold (its quota
    plus what it may borrow), and what one leaves over goes to the others."""
    want = {t: min(d, caps[t]) if caps.get(t) is not None else d
            for t, d in demand.items() if d > 0}
    out = dict.fromkeys(demand, 0.0)
    left = float(total)
    while want and left > 1e-9:
        per_weight = left / sum(weights.get(t, 1.0) for t in want)
        full = {t: d for t, d in want.items() if d <= weights.get(t, 1.0) * per_weight}
        if not full:
            for t in want:
                out[t] += weights.get(t, 1.0) * per_weight
            break
        for t, d in full.items():
            out[t] += d
            left -= d
            del want[t]
    return out


def usage_history(jobs: list[dict], shares: dict[str, float], total_gpus: int,
                  now: datetime, window: float,
                  quotas: dict[str, int | None] | None = None) -> dict[str, Series]:
    """GPUs each team held, and its fair share (`fair_shares` of the GPUs its pending and
    live jobs asked for, each team capped at `quotas`: the most it may hold), at every
    change in the window."""
    quotas = quotas or {}
    t_now, start = now.timestamp(), now.timestamp() - window
    events: list[tuple[float, str, int, int]] = []   # (time, team, d_held, d_demand)
    for j in jobs:
        submitted = parse_time(j.get("submitted_at"))
        if submitted is None:
            continue
        end = parse_time(j.get("finished_at"))
        t_end = end.timestamp() if end else None
        if t_end is not None and t_end < start:
            continue
        gpus, team = job_gpus(j.get("spec", {})), j["team"]
        events.append((submitted.timestamp(), team, 0, gpus))
        if t_end is not None:
            events.append((t_end, team, 0, -gpus))
        admitted = parse_time(j.get("admitted_at"))
        if admitted is not None and gpus:
            events.append((admitted.timestamp(), team, gpus, 0))
            if t_end is not None:
                events.append((t_end, team, -gpus, 0))
    teams = sorted(set(shares) | {e[1] for e in events})
    held = dict.fromkeys(teams, 0)
    active = dict.fromkeys(teams, 0)           # GPUs asked for by pending and live jobs
    out = {t: Series() for t in teams}

    def record(at: float) -> None:
        fair_now = fair_shares(active, shares, quotas, total_gpus)
        for t in teams:
            fair = fair_now[t]
            s = out[t]
            if not s.held or s.held[-1][1] != held[t] or s.fair[-1][1] != fair:
                s.held.append((at, held[t]))
                s.fair.append((at, fair))

    events.sort(key=lambda e: e[0])
    i = 0
    while i < len(events) and events[i][0] <= start:       # the state when the window opens
        _, team, dh, da = events[i]
        held[team] += dh
        active[team] += da
        i += 1
    record(start)
    while i < len(events):
        at = events[i][0]
        if at > t_now:
            break
        while i < len(events) and events[i][0] == at:        # apply a moment's changes at once
            _, team, dh, da = events[i]
            held[team] += dh
            active[team] += da
            i += 1
        record(at)
    for s in out.values():                                   # extend every line to now
        s.held.append((t_now, s.held[-1][1]))
        s.fair.append((t_now, s.fair[-1][1]))
    return out


def gpu_hours(points: list[tuple[float, float]]) -> float:
    """Area under a step function, in GPU-hours."""
    return sum((b[0] - a[0]) * a[1] for a, b in zip(points, points[1:], strict=False)) / 3600
