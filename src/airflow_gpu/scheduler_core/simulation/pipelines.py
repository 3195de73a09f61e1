"""Pipelines in a trace: jobs that start after their upstream jobs have ended, and
deadlines (trace.py's `dag_run`, `upstream` and `deadline` columns).

The simulator submits a job once its submit time has come and every upstream job has
ended (`Gate`), and tells the scheduler its `downstream` work as the operators would: the
longest path of the jobs after it, at their planned runtimes (`downstream`). The
metrics judge each pipeline against the earliest it could end on an empty cluster
(`earliest_ends`): a deadline before that is infeasible, not the policy's miss.
trace.py checks the upstream ids when it loads a trace: they name jobs, with no cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from graphlib import TopologicalSorter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .trace import TraceJob


def _topological(jobs: Iterable[TraceJob]) -> list[TraceJob]:
    """Upstream jobs before their downstream ones (trace.check_upstream refused cycles)."""
    ids = {t.job_id: t for t in jobs}
    return [ids[j] for j in TopologicalSorter(
        {t.job_id: t.upstream for t in ids.values()}).static_order()]


def downstream(jobs: list[TraceJob]) -> dict[str, float]:
    """Per job, the longest path of the jobs after it at their planned runtimes (0 for a
    job nothing waits for)."""
    out: dict[str, float] = {t.job_id: 0.0 for t in jobs}
    for t in reversed(_topological(jobs)):
        for u in t.upstream:
            out[u] = max(out[u], t.planned + out[t.job_id])
    return out


def earliest_ends(jobs: list[TraceJob]) -> dict[str, float]:
    """Per pipeline (its dag_run, else the job's own id), the earliest it could end:
    each job started at its submit time or once its upstream jobs end, whichever is
    later, at its planned runtime, on an empty cluster."""
    end: dict[str, float] = {}
    out: dict[str, float] = {}
    for t in _topological(jobs):
        end[t.job_id] = max([t.submit, *(end[u] for u in t.upstream)]) + t.planned
        if t.dag_run or t.deadline is not None:
            key = pipeline_of(t)
            out[key] = max(out.get(key, 0.0), end[t.job_id])
    return out


def pipeline_of(t) -> str:
    return t.dag_run or t.job_id


class Gate:
    """Jobs held until their upstream jobs have ended."""

    def __init__(self, jobs: list[TraceJob]):
        self.waiting: dict[str, int] = {t.job_id: len(set(t.upstream))
                                        for t in jobs if t.upstream}
        self.after: dict[str, list[TraceJob]] = {}
        for t in jobs:
            for u in set(t.upstream):
                self.after.setdefault(u, []).append(t)

    def held(self, t: TraceJob) -> bool:
        return t.job_id in self.waiting

    def ended(self, job_id: str) -> list[TraceJob]:
        """The jobs that `job_id`'s end lets go (their last upstream job)."""
        out = []
        for t in self.after.pop(job_id, ()):
            self.waiting[t.job_id] -= 1
            if not self.waiting[t.job_id]:
                del self.waiting[t.job_id]
                out.append(t)
        return out

    def never(self, job_id: str) -> list[TraceJob]:
        """The jobs that can never be submitted since `job_id` never runs (rejected):
        every job after it."""
        out, stack = [], [job_id]
        while stack:
            for t in self.after.pop(stack.pop(), ()):
                if self.waiting.pop(t.job_id, None) is not None:
                    out.append(t)
                    stack.append(t.job_id)
        return out
