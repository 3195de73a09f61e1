"""Estimates corrected by what each team's jobs really ran: system-generated predictions.

Users' runtimes are wrong, and some are wrong on purpose: a job that says it is short is
backfilled sooner. As in Tsafrir, Etsion and Feitelson ("Backfilling using
system-generated predictions rather than user runtime estimates", IEEE TPDS 2007), the
planner does not take a runtime at its word: it plans a job with its estimate times its
team's observed ratio of actual to estimated runtime, learned from the team's jobs that
ran to their end on one host or one NVLink domain (where placement does not slow a job:
the locality model, timemodel.py, learns what spreading costs). A team that
under-declares is planned as long as it really runs (so under-declaring buys neither
backfill nor the size factor's head start), and honest teams are not charged for it.

Ratios are kept per team and per source of the runtime: an `expected_runtime` (or the
policy's default) and a `time_limit` alone (Slurm users' limits, mostly far too long)
are corrected apart. The policy's `correct_estimates` says which way: `up` (only teams
that overrun: a team's long estimates stand), `both` (the learned ratio either way, as
Tsafrir's predictions), or `off`. `estimate_quantile` plans with that quantile of the
team's log ratios instead of their mean (0.5: the mean), so that fewer jobs overrun.

Learning is an exponentially weighted mean and spread of log ratios (recent jobs count
most: a team that changes its ways is re-learned), starting from a prior of `_PRIOR` jobs
that ran exactly as estimated (a team's first few overruns move its factor little).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

_PRIOR = 8.0                        # jobs the prior (estimates are exact) is worth
_DECAY = 0.98                       # each new sample: older ones' weight times this
_MIN_RATIO, _MAX_RATIO = 0.01, 100.0
_MIN_FACTOR, _MAX_FACTOR = 0.05, 20.0
_STEP = 1.05


def source(expected_runtime, time_limit) -> str:
    """What a job's planned runtime came from: `limit` when it gave only a time limit."""
    return "limit" if expected_runtime is None and time_limit is not None else "estimate"


@dataclass
class _Ratios:
    # the prior: _PRIOR jobs that ran exactly as estimated (log ratio 0), which decay
    # like any other sample, so a team's own record takes over as it grows
    n: float = _PRIOR       # weight of the samples (decayed count)
    s1: float = 0.0         # weighted sum of log ratios
    s2: float = 0.0         # weighted sum of their squares
    seen: int = 0           # samples, undecayed (the report)

    def add(self, log_ratio: float) -> None:
        self.n = self.n * _DECAY + 1.0
        self.s1 = self.s1 * _DECAY + log_ratio
        self.s2 = self.s2 * _DECAY + log_ratio * log_ratio
        self.seen += 1

    def planned_log(self, z: float) -> float:
        """The log factor planned with: the weighted mean plus z weighted spreads."""
        mean = self.s1 / self.n
        spread = math.sqrt(max(self.s2 / self.n - mean * mean, 0.0)) if z else 0.0
        return mean + z * spread


class EstimateCorrection:
    """Runtime factors per (team, source), learned from jobs that ran to their end."""

    def __init__(self, mode: str = "off", quantile: float = 0.5):
        self.mode, self.quantile = mode, quantile
        self._z = NormalDist().inv_cdf(quantile) if 0 < quantile < 1 else 0.0
        self._obs: dict[tuple[str, str], _Ratios] = {}
        self._cache: dict[tuple[str, str], float] = {}
        self.version = 0      # counts changes of any factor: plans made before are stale

    def copy(self) -> EstimateCorrection:
        out = EstimateCorrection(self.mode, self.quantile)
        out._obs = {k: _Ratios(r.n, r.s1, r.s2, r.seen) for k, r in self._obs.items()}
        out.version = self.version
        return out

    def observe(self, team: str, src: str, estimate: float, actual: float) -> None:
        """A job of `team` planned (before any correction) for `estimate` seconds ran for
        `actual` seconds where placement did not slow it."""
        if self.mode == "off" or estimate <= 0 or actual <= 0:
            return
        ratio = actual / estimate
        if not _MIN_RATIO <= ratio <= _MAX_RATIO:
            return
        key = (team, src)
        before = self.factor(team, src)
        self._obs.setdefault(key, _Ratios()).add(math.log(ratio))
        self._cache.pop(key, None)
        if self.factor(team, src) != before:
            self.version += 1

    def factor(self, team: str, src: str) -> float:
        """What a job of `team` whose runtime came from `src` is planned with: its runtime
        times this."""
        key = (team, src)
        got = self._cache.get(key)
        if got is None:
            obs = self._obs.get(key)
            if self.mode == "off" or obs is None:
                return 1.0
            f = math.exp(obs.planned_log(self._z))
            if self.mode == "up":
                f = max(f, 1.0)
            # in steps of 5 %: finer is noise, and each change makes older plans stale
            f = _STEP ** round(math.log(f, _STEP))
            got = self._cache[key] = round(min(max(f, _MIN_FACTOR), _MAX_FACTOR), 3)
        return got

    def report(self) -> list[dict]:
        """Per team and source: samples and the factor planned with."""
        return [{"team": team, "source": src, "samples": self._obs[(team, src)].seen,
                 "factor": self.factor(team, src)} for team, src in sorted(self._obs)]
