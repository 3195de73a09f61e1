"""GPU usage and fair share per team over a past window, derived from the scheduler's job
records (submitted, admitted and finished times, GPUs from the spec) rather than sampled,
so it survives restarts and is the same in every API server worker.

What it cannot know: quotas and share weights as they were (today's are used for the
whole window), and jobs older than the records fetched (the newest N plus every pending
and live job)."""

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


def usage_history(jobs: list[dict], shares: dict[str, float], total_gpus: int,
                  now: datetime, window: float) -> dict[str, Series]:
    """GPUs each team held, and its fair share (its weight over the weights of the teams
    with jobs in the system, times the cluster's GPUs), at every change in the window."""
    t_now, start = now.timestamp(), now.timestamp() - window
    events: list[tuple[float, str, int, int]] = []   # (time, team, d_held, d_active)
    for j in jobs:
        submitted = parse_time(j.get("submitted_at"))
        if submitted is None:
            continue
        end = parse_time(j.get("finished_at"))
        t_end = end.timestamp() if end else None
        if t_end is not None and t_end < start:
            continue
        gpus, team = job_gpus(j.get("spec", {})), j["team"]
        events.append((submitted.timestamp(), team, 0, 1))
        if t_end is not None:
            events.append((t_end, team, 0, -1))
        admitted = parse_time(j.get("admitted_at"))
        if admitted is not None and gpus:
            events.append((admitted.timestamp(), team, gpus, 0))
            if t_end is not None:
                events.append((t_end, team, -gpus, 0))
    teams = sorted(set(shares) | {e[1] for e in events})
    held = dict.fromkeys(teams, 0)
    active = dict.fromkeys(teams, 0)
    out = {t: Series() for t in teams}

    def record(at: float) -> None:
        weights = {t: shares.get(t, 1.0) for t in teams if active[t] > 0}
        total_w = sum(weights.values())
        for t in teams:
            fair = total_gpus * weights[t] / total_w if t in weights and total_w else 0.0
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
