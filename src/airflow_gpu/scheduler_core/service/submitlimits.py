"""Limits on the jobs one team, and one user of it, may have submitted and not ended
(pending, held or running): Slurm's MaxSubmitJobs, Grid Engine's max_u_jobs. Generous by
default (policy `max_submit_jobs`, `user_max_submit_jobs`), they keep one team's arrays
from filling the queue for everyone; a refusal names the limit and what to do.

Counting a team's open jobs on every submit would cost a scan of the queue per request,
so each process keeps the counts it last read (all teams in one grouped query, at most
AGE seconds old) plus what it accepted since, and counts again at once when a submit
comes near a limit. Submits through several replicas at the same instant may pass a
limit by the jobs in flight between two counts: a limit bounds the queue, it is not
accounting."""

from __future__ import annotations

import threading
import time
from collections import Counter

from sqlalchemy import func, select

from ..errors import InputError
from ..store.models import JobRow
from .common import LIVE, PENDING

OPEN = (PENDING, *LIVE)
AGE = 1.0            # seconds the counts are trusted far from a limit
NEAR = 0.9           # past this share of a limit, count again first
RECOUNT = 0.05       # seconds: near a limit, counted at most this often


class OverLimit(InputError):
    """A submit would take a team or user past its max_submit_jobs."""


class OpenJobs:
    """Open jobs per team and per (team, user), as this process knows them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read_at = -1e18
        self.teams: Counter[str] = Counter()
        self.users: Counter[tuple[str, str]] = Counter()

    def count(self, svc) -> None:
        teams: Counter[str] = Counter()
        users: Counter[tuple[str, str]] = Counter()
        with svc.reads() as s:
            for team, user, n in s.execute(select(JobRow.team, JobRow.user, func.count())
                                           .where(JobRow.state.in_(OPEN))
                                           .group_by(JobRow.team, JobRow.user)):
                teams[team] += n
                if user:
                    users[(team, user)] += n
        self.teams, self.users, self.read_at = teams, users, time.monotonic()


def open_jobs(svc) -> OpenJobs:
    got = getattr(svc, "open_jobs", None)
    if got is None:
        got = svc.open_jobs = OpenJobs()
    return got


def admit(svc, asks: Counter[tuple[str, str | None]]) -> None:
    """Take `asks` (jobs to submit per (team, user)) against the limits, or raise OverLimit
    naming the first limit they would pass; taken, they count until the next count."""
    policy = svc._policy()
    limits = {k: policy.submit_limits(*k) for k in asks}
    if all(t is None and u is None for t, u in limits.values()):
        return
    known = open_jobs(svc)
    with known.lock:
        age = time.monotonic() - known.read_at
        # near a limit, or over it (jobs may have ended meanwhile): counted again first,
        # at most every RECOUNT seconds (a team at its limit must not make each refusal
        # cost a count)
        if age > AGE or (age > RECOUNT and (_near(known, asks, limits)
                                            or _over(known, asks, limits))):
            known.count(svc)
        if (why := _over(known, asks, limits)) is not None:
            raise OverLimit(why)
        for (team, user), n in asks.items():
            known.teams[team] += n
            if user:
                known.users[(team, user)] += n


def _over(known: OpenJobs, asks, limits) -> str | None:
    """What the first limit `asks` would pass says, or None."""
    by_team: Counter[str] = Counter()
    for (team, _), n in asks.items():
        by_team[team] += n
    for (team, user), n in asks.items():
        team_max, user_max = limits[(team, user)]
        if team_max is not None and known.teams[team] + by_team[team] > team_max:
            return _said(f"team {team!r}", known.teams[team], by_team[team], team_max,
                         "max_submit_jobs", f"--team {team}")
        if user_max is not None and user and known.users[(team, user)] + n > user_max:
            return _said(f"user {user!r} of team {team!r}", known.users[(team, user)], n,
                         user_max, "user_max_submit_jobs", f"--user {user}")
    return None


def _near(known: OpenJobs, asks, limits) -> bool:
    for (team, user), n in asks.items():
        team_max, user_max = limits[(team, user)]
        if team_max is not None and known.teams[team] + n > NEAR * team_max:
            return True
        if user_max is not None and user and known.users[(team, user)] + n > NEAR * user_max:
            return True
    return False


def _said(who: str, have: int, n: int, most: int, field: str, flag: str) -> str:
    return (f"{field}: {who} has {have:,} jobs submitted and not ended (pending, held or "
            f"running); {n:,} more would pass its limit of {most:,} (policy {field}, "
            f"Slurm's MaxSubmitJobs). Nothing was submitted: wait for jobs to end, cancel "
            f"some (airflow-gpu cancel {flag} --state pending), or ask an admin to raise "
            f"{field} in the policy file")
