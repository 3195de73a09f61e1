"""Deadlines: a job's slack, and the order of the jobs that run short of it.

A job of a pipeline that must be done by a deadline (the spec's `deadline`, with
`downstream`: the work still to run after it) must start by its latest start,
deadline - (its planned runtime + downstream). Its slack is latest start - now. Within a
band, the jobs whose slack is under the policy's `deadline_slack` go ahead of the band's
other jobs (but behind a protected job promised a start: its promise stands; one not
yet promised comes after them, jobqueue.py), least slack first, as
least-laxity-first schedulers do (Chronus, SoCC'21; ElasticFlow, ASPLOS'23), except
that the jobs whose latest start has passed come after those that can still meet their
deadlines (least laxity first alone lets a lost cause hold the GPUs of one that is not).
Since now moves for every job alike, least slack first is earliest latest start first:
a static order, kept sorted as jobs come and go (jobqueue.py), so a pass never sorts
for it.
"""

from __future__ import annotations

import bisect
import math

from ..units import format_duration, relative
from .types import Pending


def latest_start(deadline: float, runtime: float, downstream: float) -> float:
    """When a job must start for its pipeline to end by `deadline`."""
    return deadline - (runtime + downstream)


def urgent(job) -> bool:
    """Whether the job may go ahead for its deadline: it has one, and it was not requeued
    as idle (that keeps it at the back of its band, jobqueue.py)."""
    return job.latest_start < math.inf and not job.behind


def urgent_before(now: float, deadline_slack: float) -> float:
    """Jobs whose latest start is before this go ahead in their band (-inf: none, the
    setting is off)."""
    return now + deadline_slack if deadline_slack > 0 else -math.inf


class ByLatestStart:
    """One band's jobs with a deadline, earliest latest start first."""

    def __init__(self):
        self.entries: list[tuple] = []          # (latest_start, seq, job)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, job) -> None:
        self.entries.insert(bisect.bisect_left(self.entries, (job.latest_start, job.seq)),
                            (job.latest_start, job.seq, job))

    def remove(self, job) -> None:
        del self.entries[bisect.bisect_left(self.entries, (job.latest_start, job.seq))]

    def count_before(self, t: float) -> int:
        """How many entries have a latest start before `t`."""
        return bisect.bisect_left(self.entries, (t, -math.inf))

    def before(self, t: float, now: float = -math.inf) -> list[tuple]:
        """The entries whose latest start is before `t`, earliest first, but those whose
        latest start has passed (before `now`: they miss whatever happens) after the
        others: one that has missed never holds the resources of one that still can."""
        k, gone = self.count_before(t), self.count_before(min(now, t))
        return self.entries[gone:k] + self.entries[:gone]


def at_risk(job, why, now: float):
    """`why` as DeadlineAtRisk when the waiting job cannot meet its deadline: its latest
    start has passed, or the pass expects it to start after it (its ETA). The cause stays
    in the message and in `details["cause"]`; the times in details are the pass's clock."""
    if job.latest_start == math.inf:
        return why
    start = now if why.eta is None else now + why.eta
    late = start - job.latest_start
    if late <= 0:
        return why

    by = (f"should start {relative(job.latest_start - now)}" if job.latest_start > now
          else f"should have started {relative(job.latest_start - now)}")
    started = ("even if it started now" if why.eta is None or why.eta <= 0
               else f"it is expected to start {relative(start - now)}")
    due = "is due" if job.deadline > now else "was due"
    message = (f"deadline at risk: its pipeline {due} {relative(job.deadline - now)} and needs "
               f"{format_duration(job.deadline - job.latest_start)} from this job's start "
               f"(its own runtime and the work after it), so it {by}; {started}, about "
               f"{format_duration(late)} late. Waiting for: {why.code}: {why.message}")
    details = {**why.details, "cause": why.code, "deadline": job.deadline,
               "latest_start": job.latest_start, "expected_late_s": round(late)}
    return Pending("DeadlineAtRisk", message, details, why.eta)
