"""Fair share: decayed GPU-seconds per account, integrated exactly between updates, and
the priority points they give, over a tree of two levels as Slurm's associations and
Grid Engine's share tree have it.

An account is a team, or a user of a team (`team/user`, types.account). Teams share the
cluster by their shares: a team's usage ratio r = its part of all usage / its part of the
shares, and its factor 2^(-r) (Slurm's classic formula). A team's users share its part
by their shares (1 each unless the policy says: Slurm's NormShares multiply down the
tree), and a user's effective ratio follows Slurm's depth-oblivious fair share:
R = r_team x rl^k, where rl is the user's ratio over its team's and k = 1 where both
lean the same way, else 1 / (1 + (5 ln r_team)^2): a user's own usage counts fully in a
team at its share, and less the further its team is from it, so a light user of a team
that used four times its share still ranks near that team. A team whose jobs name no
user is one account, with exactly the team's factor.

Between two updates an account running g GPUs adds g * H/ln2 * (1 - 2^(-dt/H)) (the
integral of the decayed usage), and what it had decays by 2^(-dt/H).
"""

from __future__ import annotations

import math

from .config import PolicyConfig
from .types import team_of


class FairShare:
    def __init__(self, config: PolicyConfig, now: float = 0.0):
        self.config = config
        self.half_life = float(config.fairshare_half_life)
        self.usage: dict[str, float] = {}       # account -> decayed GPU-seconds
        self.running: dict[str, int] = {}       # GPUs each account holds now
        self.now = now
        self.errors: dict[str, str] = {}        # team -> why a factor could not be had

    def advance(self, now: float) -> None:
        dt = now - self.now
        if dt <= 0:
            return
        decay = 2.0 ** (-dt / self.half_life)
        gain = self.half_life / math.log(2) * (1.0 - decay)
        for a in set(self.usage) | set(self.running):
            self.usage[a] = self.usage.get(a, 0.0) * decay + self.running.get(a, 0) * gain
        self.now = now

    def add_past(self, account: str, gpus: int, start: float, end: float) -> None:
        """Usage of a job that ran from `start` to `end` (both before the current time)."""
        h, ln2 = self.half_life, math.log(2)
        ago_end, ago_start = max(0.0, self.now - end), max(0.0, self.now - start)
        self.usage[account] = self.usage.get(account, 0.0) + gpus * h / ln2 * (
            2.0 ** (-ago_end / h) - 2.0 ** (-ago_start / h))

    def add(self, account: str, gpus: int, now: float) -> None:
        """`gpus` (negative: returned) held by `account` from `now` on."""
        self.advance(now)
        self.running[account] = self.running.get(account, 0) + gpus

    def factors(self, accounts) -> dict[str, float]:
        """Priority points per account."""
        return {a: points for a, (_, _, points) in self.terms(accounts).items()}

    def team_usage(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for a, u in self.usage.items():
            used[team_of(a)] = used.get(team_of(a), 0.0) + u
        return used

    def terms(self, accounts) -> dict[str, tuple[float, float, float]]:
        """Per account (its part of all decayed usage, its normalized share, its priority
        points): what `factors` gives the pass, with the two fractions it comes from
        (Slurm's sshare: EffectvUsage, NormShares, FairShare). A team's name as an
        account is the team as a whole where none of its jobs names a user."""
        accounts = set(accounts)
        cfg = self.config
        total_use = sum(self.usage.values())
        members: dict[str, set[str]] = {}        # team -> its accounts (the siblings)
        for a in accounts | set(self.usage):
            members.setdefault(team_of(a), set()).add(a)
        for t, policy in cfg.teams.items():
            if t in members and policy.users:    # named users count where the team is seen
                members[t] |= {f"{t}/{u}" for u in policy.users}
        teams = set(members) | set(cfg.teams)
        total_share = sum(cfg.share(t) for t in teams) or 1.0
        used = self.team_usage()
        out = {}
        for a in accounts:
            t = team_of(a)
            u = s = 0.0
            try:
                u_team = used.get(t, 0.0) / total_use if total_use > 0 else 0.0
                s_team = cfg.share(t) / total_share
                if members[t] == {a}:            # the team's only account: the team's
                    u, s, ratio = u_team, s_team, u_team / s_team
                else:
                    part = sum(cfg.user_share(t, _user(x)) for x in members[t])
                    s = s_team * cfg.user_share(t, _user(a)) / part
                    u = self.usage.get(a, 0.0) / total_use if total_use > 0 else 0.0
                    ratio = _effective(u_team / s_team, u / s)
                points = cfg.fairshare_weight * 2.0 ** (-ratio)
                if not math.isfinite(points):
                    raise ArithmeticError(f"the factor is {points}")
            except ArithmeticError as exc:   # one team's bad numbers must not stop a pass
                who = f"team {t}" if a == t else f"user {_user(a)} of team {t}"
                self.errors[t] = (f"fair share of {who} cannot be computed (usage "
                                  f"{self.usage.get(a, 0.0):g}, share {cfg.share(t)!r}: "
                                  f"{exc}); its jobs are ordered with factor 0")
                points = 0.0
            out[a] = (u, s, points)
        return out

    def team_terms(self, teams) -> dict[str, tuple[float, float, float]]:
        """The same per team as a whole: its part of all usage, of the shares, and the
        points it would get as one account (sshare's team lines)."""
        teams = set(teams)
        used, total_use = self.team_usage(), sum(self.usage.values())
        known = teams | set(used) | set(self.config.teams)
        total_share = sum(self.config.share(t) for t in known) or 1.0
        out = {}
        for t in teams:
            u = used.get(t, 0.0) / total_use if total_use > 0 else 0.0
            s = self.config.share(t) / total_share
            try:
                points = self.config.fairshare_weight * 2.0 ** (-u / s)
            except ArithmeticError:
                points = 0.0
            out[t] = (u, s, points if math.isfinite(points) else 0.0)
        return out


LOCAL_FLOOR = 1e-6    # a user who used nothing yet counts as having used this much


def _effective(r_team: float, r_user: float) -> float:
    """Slurm's depth-oblivious effective usage ratio of a user under its team."""
    if r_team <= 0:
        return 0.0
    local = max(r_user / r_team, LOCAL_FLOOR)
    lean = math.log(r_team) * math.log(local)
    k = 1.0 if lean >= 0 else 1.0 / (1.0 + (5.0 * math.log(r_team)) ** 2)
    return r_team * local ** k


def _user(account: str) -> str | None:
    return account.split("/", 1)[1] if "/" in account else None
