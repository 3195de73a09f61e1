"""Rules on_deadline in the engine (issue 44, point 10): a job whose latest start has
passed (it misses even if it started now) never preempts, and a team whose deadlines the
policy lets preempt no one (`deadline_preempts`) never does either."""

from __future__ import annotations

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from tests.helpers import job, make_cluster

ONE_HOST = ({"name": "dgx-1", "model": "dgx-a100"},)
EIGHT = {"name": "w", "gpus": 8}


def _scheduler(**policy) -> Scheduler:
    """One host held by `low` (nlp, no deadline) until 99,999; `etl` (vision, 8 GPUs,
    1 h, due at 10,000: latest start 6,400) waits for it under a rule on_deadline."""
    s = Scheduler(ClusterState(make_cluster(*ONE_HOST)), PolicyConfig.model_validate({
        "preemption": {"rules": [{"on_deadline": True, "preempts_below": 10}],
                       "min_run_time": 0, "min_saved_wait": 0, **policy.pop("more", {})},
        **policy}))
    s.submit(job("low", EIGHT, team="nlp", expected_runtime=99_999), 0.0)
    s.schedule(0.0)
    s.submit(job("etl", EIGHT, team="vision", expected_runtime=3600), 10.0,
             deadline=10_000.0)
    return s


def test_a_lost_cause_never_preempts():
    # at its latest start it still can make it: it preempts
    assert [p.victim.name for p in _scheduler().schedule(6400.0).preempted] == ["low"]
    # a second later it cannot, whatever it stops: it stops nothing, and says why it waits
    s = _scheduler()
    got = s.schedule(6401.0, explain=True)
    assert not got.preempted
    assert got.pending["etl"].code == "DeadlineAtRisk"
    # a deadline long past (the pass's clock, as a 1970 deadline is to the service)
    s = Scheduler(ClusterState(make_cluster(*ONE_HOST)), PolicyConfig.model_validate(
        {"preemption": {"rules": [{"on_deadline": True, "preempts_below": 10}],
                        "min_run_time": 0, "min_saved_wait": 0}}))
    s.submit(job("low", EIGHT, team="nlp", expected_runtime=99_999), 0.0)
    s.schedule(0.0)
    s.submit(job("old", EIGHT, team="vision", expected_runtime=60), 10.0, deadline=20.0)
    assert not s.schedule(5000.0).preempted


def test_whose_deadlines_preempt_is_the_policys_per_team():
    policy = PolicyConfig.model_validate({"teams": {"vision": {"deadline_preempts": False}}})
    assert not policy.deadline_preempts("vision") and policy.deadline_preempts("nlp")
    # vision may not: neither at its latest start nor while urgent before it
    for now in (5000.0, 6400.0):
        s = _scheduler(teams={"vision": {"deadline_preempts": False}})
        assert not s.schedule(now).preempted
    # none may but those the policy names
    s = _scheduler(more={"deadline_preempts": False},
                   teams={"vision": {"deadline_preempts": True}})
    assert [p.victim.name for p in s.schedule(5000.0).preempted] == ["low"]
    s = _scheduler(more={"deadline_preempts": False})
    assert not s.schedule(5000.0).preempted
