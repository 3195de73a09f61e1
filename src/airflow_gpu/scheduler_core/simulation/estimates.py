"""What a replay tells the scheduler of each job's runtime (`simulate --estimate-error`).

A trace's own `expected_runtime` (an estimate: it never stops a job) and `time_limit` (a
hard limit) columns are kept; where a job has neither, the mode derives them from its
trace duration and its id, so a replay is the same every time:

- `exact`: the estimate is the duration (users who know their runtimes);
- `lognormal:SIGMA`: the duration times exp(SIGMA x z), z standard normal (median exact;
  what the operators' median of a task's last runs gives);
- `limit:LO-HI`: no estimate, a time limit of the duration times a factor log-uniform in
  [LO, HI], rounded up to the hour (Slurm users' `--time`; the planner plans with it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist

from ..errors import InputError
from .trace import TraceJob

FORMS = "exact, lognormal:SIGMA (e.g. lognormal:0.5) or limit:LO-HI (e.g. limit:1.5-10)"


@dataclass(frozen=True)
class EstimateError:
    kind: str = "exact"                 # exact | lognormal | limit
    sigma: float = 0.0
    low: float = 1.0
    high: float = 1.0

    def __str__(self) -> str:
        return {"exact": "exact", "lognormal": f"lognormal:{self.sigma:g}",
                "limit": f"limit:{self.low:g}-{self.high:g}"}[self.kind]


def parse_estimate_error(text: str) -> EstimateError:
    kind, _, arg = text.strip().partition(":")
    try:
        if kind == "exact" and not arg:
            return EstimateError()
        if kind == "lognormal":
            sigma = float(arg)
            if math.isfinite(sigma) and sigma >= 0:
                return EstimateError("lognormal", sigma=sigma)
        if kind == "limit":
            low, _, high = arg.partition("-")
            lo, hi = float(low), float(high)
            if 1 <= lo <= hi and math.isfinite(hi):
                return EstimateError("limit", low=lo, high=hi)
    except ValueError:
        pass
    raise InputError(f"--estimate-error: {text!r} is not a mode; give {FORMS} (SIGMA 0 or "
                     "more; 1 <= LO <= HI: a limit is never below the runtime)")


def _unit(job_id: str, salt: str) -> float:
    """A number in (0, 1) fixed by the job's id."""
    digest = hashlib.sha256(f"{salt}/{job_id}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") + 0.5) / 2**64


def with_estimates(trace: list[TraceJob], mode: EstimateError) -> list[TraceJob]:
    """The trace with each job's estimate and limit as `mode` makes them, where the trace
    gives neither."""
    out = []
    for t in trace:
        if t.expected_runtime is not None or t.time_limit is not None:
            out.append(t)
        elif mode.kind == "lognormal":
            z = NormalDist().inv_cdf(_unit(t.job_id, "lognormal"))
            out.append(dataclasses.replace(
                t, expected_runtime=max(1.0, t.duration * math.exp(mode.sigma * z))))
        elif mode.kind == "limit":
            factor = mode.low * (mode.high / mode.low) ** _unit(t.job_id, "limit")
            out.append(dataclasses.replace(
                t, time_limit=3600.0 * math.ceil(t.duration * factor / 3600)))
        else:
            out.append(t)
    return out
