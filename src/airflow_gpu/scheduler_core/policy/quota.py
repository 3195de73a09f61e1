"""Team quotas: what each team holds, its guarantee and its limit (guarantee + what it may
borrow), per resource (GPUs, CPUs, memory).

A job within its team's guarantee starts as guaranteed work; beyond it (up to the limit)
it starts on GPUs other teams leave idle and is marked borrowed: the owners may reclaim
them (preempt.py). A job whose class is not preemptible never borrows, since it could not
be given back.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from ..engine.mig import gpu_share
from ..jobspec import JobSpec
from ..units import format_size
from .config import RESOURCES, PolicyConfig
from .types import Pending

if TYPE_CHECKING:
    from .types import QueuedJob

Usage = list[float]            # [gpus, cpus, memory bytes]
SAY = ("GPUs", "CPUs", "of memory")


def need(job: QueuedJob) -> tuple[float, int, int]:
    return job.charge, job.cpus, job.memory


def charged_gpus(spec: JobSpec) -> int | Fraction:
    """The GPUs a gang is charged (quotas, borrowing, fair share): its whole GPUs plus each
    MIG device's share of its GPU (mig.gpu_share: compute slices / 7)."""
    return spec.total_gpus + sum(r.replicas * r.gpu.mig.count * gpu_share(r.gpu.mig.profile)
                                 for r in spec.roles if r.gpu.mig)


def spec_need(spec: JobSpec) -> tuple[float, int, int]:
    """(charged GPUs, cpus, memory bytes) of a whole gang, its job class applied."""
    return (charged_gpus(spec), sum(r.replicas * r.cpus for r in spec.roles),
            sum(r.replicas * r.booked_memory() for r in spec.roles))


def plain(v: float) -> float:
    """A count as the API and messages show it (MIG shares are Fractions, for exact sums):
    an int where whole, else rounded to 4 places."""
    f = float(v)
    return int(f) if f.is_integer() else round(f, 4)


def _show(i: int, v: float) -> str:
    return format_size(int(v)) if RESOURCES[i] == "memory" else f"{plain(v):g}"


def most(config: PolicyConfig, team: str, preemptible: bool) -> tuple[float, float, float]:
    """The most a team may hold for a job: its limit, or only its guarantee for a job
    that may not borrow (it could not be given back)."""
    return config.limit(team) if preemptible else config.guarantee(team)


def _kind(config: PolicyConfig, team: str, i: int, cap: float) -> str:
    what, g = RESOURCES[i], config.guarantee(team)[i]
    return f"quota_{what} {_show(i, g)}" + (
        "" if cap == g else f" + borrow_{what} {_show(i, cap - g)}")


def over_quota(config: PolicyConfig, team: str, needs: tuple[int, int, int],
               preemptible: bool = True) -> str | None:
    """Why a job needing (gpus, cpus, memory) can never start for `team`: more than the
    team may ever hold (its limit; its guarantee for a job that may not borrow)."""
    for i, (n, cap) in enumerate(zip(needs, most(config, team, preemptible), strict=True)):
        if n > cap:
            return (f"needs {_show(i, n)} {SAY[i]} but team {team!r} may hold at most "
                    f"{_kind(config, team, i, cap)}"
                    + ("" if preemptible else " (its job class is not preemptible, so it "
                       "never borrows)") + "; raise the team's quota or shrink the job")
    return None


class Quotas:
    """What each team holds now, against its guarantee and limit."""

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.held: dict[str, Usage] = {}
        self.users: dict[str, float] = {}     # GPUs each team/user account holds
        # no team policy at all: every limit is inf, no job ever waits for a quota
        self.unlimited = not config.teams
        self._guarantee: dict[str, tuple[float, float, float]] = {}

    def guarantee(self, team: str) -> tuple[float, float, float]:
        """config.guarantee, kept per team: a scheduler's policy does not change."""
        g = self._guarantee.get(team)
        if g is None:
            g = self._guarantee[team] = self.config.guarantee(team)
        return g

    def add(self, job: QueuedJob, sign: int = 1) -> None:
        u = self.held.setdefault(job.team, [0, 0, 0])
        for i, n in enumerate(need(job)):
            u[i] += sign * n
        if job.spec.user:
            self.users[job.account] = self.users.get(job.account, 0) + sign * job.charge

    def _after(self, job: QueuedJob) -> list[float]:
        u = self.held.get(job.team, (0, 0, 0))
        return [a + b for a, b in zip(u, need(job), strict=True)]

    def covered(self, job: QueuedJob) -> bool:
        """The team's guarantee covers the job on top of what the team holds."""
        g = self.guarantee(job.team)
        return all(a <= b for a, b in zip(self._after(job), g, strict=True))

    def fits_without(self, job: QueuedJob, victims: list[QueuedJob]) -> bool:
        """The job is within its team's limit once `victims` (its team's) are gone."""
        after = self._after(job)
        for v in victims:
            if v.team == job.team:
                after = [a - n for a, n in zip(after, need(v), strict=True)]
        cap = most(self.config, job.team, job.preemptible)
        return all(a <= b for a, b in zip(after, cap, strict=True))

    def guaranteed(self, team: str) -> bool:
        """The team has a GPU guarantee of its own (so it may reclaim)."""
        t = self.config.teams.get(team)
        return t is not None and t.quota_gpus is not None

    def over(self, team: str, less: Usage = (0, 0, 0)) -> bool:
        """The team holds (minus `less`) more than its guarantee in some resource."""
        u = self.held.get(team, (0, 0, 0))
        g = self.guarantee(team)
        # GPUs, CPUs, memory, unrolled: a preemption search asks it of every team
        return u[0] - less[0] > g[0] or u[1] - less[1] > g[1] or u[2] - less[2] > g[2]

    def wait(self, job: QueuedJob) -> Pending | None:
        """Why the job may not start now for its team's quota, or None."""
        if self.unlimited:
            return None
        caps = most(self.config, job.team, job.preemptible)
        for i, (a, cap) in enumerate(zip(self._after(job), caps, strict=True)):
            if a > cap:
                what = RESOURCES[i]
                held = self.held.get(job.team, (0, 0, 0))[i]
                g = self.config.guarantee(job.team)[i]
                return Pending("Quota", (
                    f"team {job.team!r} holds {_show(i, held)} {SAY[i]} of its "
                    f"{_kind(self.config, job.team, i, cap)}; this job needs "
                    f"{_show(i, need(job)[i])} more"
                    + ("" if job.preemptible or cap == math.inf else
                       " (its job class is not preemptible: it never borrows)")),
                    {f"quota_{what}": None if g == math.inf else g,
                     f"held_{what}": plain(held)})
        return self._user_wait(job)

    def _user_wait(self, job: QueuedJob) -> Pending | None:
        """The team's cap on one user's GPUs (user_quota_gpus), or None."""
        cap = self.config.user_cap(job.team, job.spec.user)
        held = self.users.get(job.account, 0)
        if cap is None or held + job.charge <= cap:
            return None
        return Pending("Quota", (
            f"user {job.spec.user!r} of team {job.team!r} holds {_show(0, held)} GPUs of "
            f"the team's user_quota_gpus {cap}; this job needs {_show(0, job.charge)} more"),
            {"user_quota_gpus": cap, "user_held_gpus": plain(held)})


def lending(config: PolicyConfig, held: dict[str, int], total: int
            ) -> dict[str, tuple[int, int]]:
    """(borrowed, lent) GPUs per team: what it holds beyond its guarantee, and the part of
    its idle guarantee that others' borrowed work uses. Borrowed work counts against the
    GPUs nobody is guaranteed first; the rest is lent by the teams with idle guarantees,
    in proportion to how much of it each leaves idle."""
    teams = set(held) | set(config.teams)
    g = {t: config.guarantee(t)[0] for t in teams}
    borrowed = {t: max(0, held.get(t, 0) - g[t]) if g[t] < math.inf else 0 for t in teams}
    idle = {t: max(0, g[t] - held.get(t, 0)) for t in teams if g[t] < math.inf}
    free_of_guarantees = max(0, total - sum(v for v in g.values() if v < math.inf))
    lent_total = min(sum(idle.values()), max(0, sum(borrowed.values()) - free_of_guarantees))
    idle_total = sum(idle.values()) or 1
    lent = {t: round(lent_total * idle.get(t, 0) / idle_total) for t in teams}
    return {t: (plain(borrowed[t]), int(lent[t])) for t in teams}
