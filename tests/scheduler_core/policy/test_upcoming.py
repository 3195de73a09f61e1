"""Waits that end by preemption say so: a job that will reclaim or preempt by priority
once its victims have run min_run_time names them and gets that ETA; a Quota wait gets
the ETA of its team's jobs freeing enough."""

from __future__ import annotations

from airflow_gpu.scheduler_core.policy.config import TeamPolicy
from tests.scheduler_core.policy.test_preemption import gpus, run
from tests.scheduler_core.policy.test_reclaim_guarantee import NLP, sched

TEN_MINUTES = {"min_run_time": 600}


def test_a_job_that_will_reclaim_names_its_victim_and_when():
    s = sched(4, NLP, **TEN_MINUTES)
    run(s, 0, gpus("a", 16, team="nlp"))
    run(s, 0, gpus("b", 16, team="nlp"))
    why = run(s, 300, gpus("v", 8, team="vision")).pending["v"]
    assert why.code == "Resources"
    assert why.message.startswith(
        "will preempt b (reclaim) once it has run min_run_time (10m), and start when it "
        "has stopped; until then: needs w 1x(8 GPUs")
    assert why.details["will_preempt"] == ["b"]
    assert why.eta == 600 + 30 - 300           # b may be stopped at 600, its grace is 30s
    # and so it happens: at 600 b is stopped for v
    res = run(s, 600)
    assert [p.victim.name for p in res.preempted] == ["b"]
    assert res.pending["v"].code == "Preempting"


def test_a_priority_rule_to_come_and_not_when_resources_free_first():
    rules = {"rules": [{"min_band": 100, "preempts_below": 100}]}
    s = sched(1, {}, **TEN_MINUTES, **rules)
    run(s, 0, gpus("low", 8, runtime=100_000))
    why = run(s, 100, gpus("urgent", 8, priority=100)).pending["urgent"]
    assert why.message.startswith("will preempt low (priority) once it has run")
    assert why.eta == 600 + 30 - 100
    # a job whose blocker ends before it could be stopped waits as before
    s = sched(1, {}, **TEN_MINUTES, **rules)
    run(s, 0, gpus("short", 8, runtime=400))
    why = run(s, 100, gpus("urgent", 8, priority=100)).pending["urgent"]
    assert "will preempt" not in why.message and why.eta == 300


def test_each_victim_to_come_is_promised_to_one_job():
    s = sched(4, NLP, **TEN_MINUTES)
    run(s, 0, gpus("a", 16, team="nlp"))
    run(s, 0, gpus("b", 16, team="nlp"))
    res = run(s, 300, gpus("v1", 8, team="vision"), gpus("v2", 8, team="vision"))
    promised = [n for n in ("v1", "v2") if "will_preempt" in res.pending[n].details]
    assert len(promised) == 1


def test_a_quota_wait_has_the_eta_of_its_teams_jobs_freeing_enough():
    s = sched(2, {"vision": TeamPolicy(quota_gpus=8)})
    run(s, 0, gpus("v1", 4, team="vision", runtime=3600))
    run(s, 0, gpus("v2", 4, team="vision", runtime=7200))
    why = run(s, 300, gpus("v3", 8, team="vision")).pending["v3"]
    assert why.code == "Quota"
    assert why.message.endswith("; enough of it is expected back when job v2 ends")
    assert why.eta == 7200 - 300 and why.details["quota_frees_with"] == "v2"
    why = run(s, 300, gpus("v4", 4, team="vision")).pending["v4"]
    assert why.eta == 3600 - 300 and why.details["quota_frees_with"] == "v1"
