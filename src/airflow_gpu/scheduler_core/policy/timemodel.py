"""How long a job runs where it is placed: the locality slowdown, learned from what ran.

A job spread over hosts runs longer than on one host (its gradients cross NICs instead
of NVLink). The engine plans with runtime = estimate x factor, where the factor depends
on the placement's tier: 0 one host, 1 several hosts under one switch, 2 across
switches. Planned ends, reservations and the backfill check all use it.

The factors start from the policy's `locality_slowdown` and are learned per job class
from jobs that ran to their end: the ratio of actual to estimated runtime on each tier,
relative to the same ratio on one host (so a class whose users always over- or
under-estimate does not read as a slowdown). Learning is a geometric mean shrunk
toward the policy's factor: a few samples move it a little, many move it all the way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.cluster import TIERS
from .correction import EstimateCorrection

if TYPE_CHECKING:
    from .config import PolicyConfig

_PRIOR = 8.0          # samples the policy's factor is worth
_MIN_RATIO, _MAX_RATIO = 0.01, 100.0   # an observed ratio outside this is not a runtime


def reestimate(start: float, end: float, now: float) -> float:
    """When a running job is expected to end. Past its planned end, it is expected to run
    on for as long as it has overrun so far, and at least a tenth of its plan (a minute at
    least): planning with "it ends now" would reserve resources that are still busy."""
    if end > now:
        return end
    return now + max(now - end, 0.1 * (end - start), 60.0)


@dataclass
class _Samples:
    n: int = 0
    log_sum: float = 0.0     # sum of log(actual / estimate)

    def add(self, ratio: float) -> None:
        self.n += 1
        self.log_sum += math.log(ratio)


class LocalityModel:
    """Slowdown factors per job class and tier: the policy's, learned from observations."""

    def __init__(self, defaults: tuple[float, float, float], learn: bool = True,
                 estimates: EstimateCorrection | None = None):
        self.defaults = _monotone(defaults)
        self.learn = learn
        # the teams' estimate factors (correction.py), learned from the same ended jobs
        self.estimates = estimates or EstimateCorrection()
        self._obs: dict[str, list[_Samples]] = {}
        self._cache: dict[str, tuple[float, float, float]] = {}
        self._version = 0

    @classmethod
    def for_policy(cls, policy: PolicyConfig) -> LocalityModel:
        """The model a policy plans with: its slowdown factors and estimate correction."""
        return cls(policy.locality_slowdown, policy.learn_slowdown,
                   EstimateCorrection(policy.correct_estimates, policy.estimate_quantile))

    @property
    def version(self) -> tuple[int, int]:
        """Changes with any factor (locality or estimates): plans made before are stale."""
        return self._version, self.estimates.version

    def copy(self) -> LocalityModel:
        out = LocalityModel(self.defaults, self.learn, self.estimates.copy())
        out._obs = {k: [_Samples(x.n, x.log_sum) for x in v] for k, v in self._obs.items()}
        out._version = self._version
        return out

    def observe(self, job_class: str | None, tier: int, estimate: float,
                actual: float) -> None:
        """A job of `job_class` planned for `estimate` seconds (on one host) ran `actual`
        seconds on a placement of `tier`."""
        if not self.learn or estimate <= 0 or actual <= 0:
            return
        ratio = actual / estimate
        if not _MIN_RATIO <= ratio <= _MAX_RATIO:
            return
        key = job_class or ""
        before = self.factors(key)
        self._obs.setdefault(key, [_Samples(), _Samples(), _Samples()])[tier].add(ratio)
        self._cache.pop(key, None)
        if self.factors(key) != before:
            self._version += 1

    def observe_run(self, job_class: str | None, team: str, src: str, tier: int,
                    estimate: float, actual: float) -> None:
        """A job ran to its end: the slowdown of its class learns from its runtime, and
        its team's estimate factor too where no slowdown can be in it (one host or one
        NVLink domain): a gang over hosts that ran long says the same thing to both, and
        counted twice it would be planned long twice."""
        if tier == 0:
            self.estimates.observe(team, src, estimate, actual)
        self.observe(job_class, tier, estimate, actual)

    def factors(self, job_class: str | None = None) -> tuple[float, float, float]:
        """The factors planned with for jobs of `job_class` (one host first: always 1)."""
        key = job_class or ""
        if not self.learn or key not in self._obs:
            return self.defaults
        got = self._cache.get(key)
        if got is None:
            obs = self._obs[key]
            base = _shrunk(obs[0], 0.0)               # the class's bias on one host
            # rounded to 1 %: finer is noise, and each change makes older plans stale
            got = self._cache[key] = _monotone(tuple(
                1.0 if t == 0 else round(math.exp(
                    _shrunk(obs[t], math.log(self.defaults[t]) + base) - base), 2)
                for t in range(3)))
        return got

    def runtime(self, estimate: float, job_class: str | None, tier: int) -> float:
        return estimate * self.factors(job_class)[tier]

    def report(self) -> list[dict]:
        """What was learned, per job class: samples and factor per tier."""
        out = []
        for key in sorted(self._obs):
            f = self.factors(key)
            out.append({"job_class": key or None, "tiers": [
                {"tier": TIERS[t], "samples": self._obs[key][t].n, "factor": round(f[t], 3),
                 "default": self.defaults[t]} for t in range(3)]})
        return out


def _shrunk(s: _Samples, prior_log: float) -> float:
    """The mean log ratio, shrunk toward `prior_log` by `_PRIOR` pseudo-samples."""
    return (s.log_sum + _PRIOR * prior_log) / (s.n + _PRIOR)


def _monotone(f) -> tuple[float, float, float]:
    """Factors relative to one host, never smaller for a wider tier."""
    one = f[0] or 1.0
    a = 1.0
    b = max(a, f[1] / one)
    return (a, b, max(b, f[2] / one))
