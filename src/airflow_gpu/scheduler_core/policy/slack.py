"""Deadlines: a job's slack, and the order of the jobs that run short of it.

A job of a pipeline that must be done by a deadline (the spec's `deadline`, with
`downstream`: the work still to run after it) must start by its latest start,
deadline - (its planned runtime + downstream). Its slack is latest start - now. Within a
band, the jobs whose slack is under the policy's `deadline_slack` go ahead of the band's
other jobs (but behind the protected job: its promise stands), least slack first, as
least-laxity-first schedulers do (Chronus, SoCC'21; ElasticFlow, ASPLOS'23). Since now
moves for every job alike, least slack first is earliest latest start first: a static
order, kept sorted as jobs come and go (jobqueue.py), so a pass never sorts for it.
"""

from __future__ import annotations

import math


def latest_start(deadline: float, runtime: float, downstream: float) -> float:
    """When a job must start for its pipeline to end by `deadline`."""
    return deadline - (runtime + downstream)


def urgent_before(now: float, deadline_slack: float) -> float:
    """Jobs whose latest start is before this go ahead in their band (-inf: none, the
    setting is off)."""
    return now + deadline_slack if deadline_slack > 0 else -math.inf

