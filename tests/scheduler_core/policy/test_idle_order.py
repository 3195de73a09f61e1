"""Queue order of jobs the idle-GPU policy requeued (`behind`, jobqueue.py point 4): after
every other job of their band whatever their size, fair share or age; before lower
bands; among themselves by the usual rules; and their wait guarantee counts from the
requeue (the time they are queued at), not from their first submit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from tests.helpers import job, make_cluster

ONE_HOST = ({"name": "dgx-1", "model": "dgx-a100"},)


def _scheduler(**policy) -> Scheduler:
    return Scheduler(ClusterState(make_cluster(*ONE_HOST)), PolicyConfig(**policy))


def gpus(name: str, n: int, **fields):
    return job(name, {"name": "w", "gpus": n}, expected_runtime=3600, **fields)


def order(s: Scheduler, now: float) -> list[str]:
    fs = s.fairshare_points(now)
    return [j.name for j, _ in s.queue.ordered(fs, s.protect_before(now))]


def test_an_idle_requeued_job_goes_behind_its_band_not_below_it():
    s = _scheduler()
    # small and first: ahead of `big` by size and by submit, were it not requeued as idle
    s.submit(gpus("idle", 1), 0, behind=True)
    s.submit(gpus("big", 8), 10)
    s.submit(gpus("low", 1, priority=-1), 0)
    assert order(s, 30) == ["big", "idle", "low"]
    res = s.schedule(30, explain=True)
    assert [j.name for j, _ in res.started] == ["big"]
    # the control: the same job not requeued as idle goes first
    s = _scheduler()
    s.submit(gpus("idle", 1), 0)
    s.submit(gpus("big", 8), 10)
    assert order(s, 30) == ["idle", "big"]


def test_behind_jobs_keep_their_own_order_and_age_from_the_requeue():
    s = _scheduler(reserve_after=1000, reserve_after_scale=1)    # every job after 1000 s
    s.submit(gpus("busy", 8), 0)
    s.schedule(0)
    s.submit(gpus("b2", 2), 500, behind=True)
    s.submit(gpus("b1", 1), 400, behind=True)      # smaller: first among the requeued
    s.submit(gpus("w", 8), 450)
    assert order(s, 520) == ["w", "b1", "b2"]
    # once it has waited reserve_after since its requeue, b1 is the band's oldest and
    # protected: the wait guarantee holds for a requeued job too, from the requeue
    assert order(s, 1400) == ["b1", "w", "b2"]
    assert order(s, 1420) == ["b1", "w", "b2"]
    assert order(s, 1399) == ["w", "b1", "b2"]


def test_hold_after_is_a_count_of_one_or_more_or_null():
    assert PolicyConfig().idle.hold_after == 2
    assert PolicyConfig.model_validate({"idle": {"hold_after": None}}).idle.hold_after is None
    with pytest.raises(ValidationError, match="hold_after"):
        PolicyConfig.model_validate({"idle": {"hold_after": 0}})
