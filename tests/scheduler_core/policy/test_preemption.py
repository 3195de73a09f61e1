"""Quota borrowing, reclaim and priority preemption in the engine, with exact outcomes on
small clusters, and a property test over random job streams (no ping-pong)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig, TeamPolicy, load_policy
from airflow_gpu.scheduler_core.policy.scheduler import Rejected, Scheduler
from tests.helpers import REPO, job, make_cluster

TWO_HOSTS = ({"name": "dgx-[1-2]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
EXACT = (1.0, 1.0, 1.0)
LONG = 100_000
URGENT = {"rules": [{"min_band": 100, "preempts_below": 100}]}


def sched(teams=None, preemption=None, **policy) -> Scheduler:
    return Scheduler(ClusterState(make_cluster(*TWO_HOSTS)), PolicyConfig(**{
        "locality_slowdown": EXACT, "teams": teams or {},
        "preemption": preemption or {}, **policy}))


def gpus(name: str, n: int, runtime: int = LONG, **fields):
    roles = ({"name": "w", "replicas": n // 8, "gpus": 8} if n > 8
             else {"name": "w", "gpus": n})
    return job(name, roles, expected_runtime=runtime, **fields)


def run(s: Scheduler, t: float, *specs) -> dict:
    for spec in specs:
        s.submit(spec, t)
    return s.schedule(t, explain=True)


def hosts_of(s: Scheduler, name: str) -> set[str]:
    return {a.host.name for a in s.state.allocations[name]}


def test_borrowing_up_to_the_limit_and_marked_borrowed():
    s = sched({"a": TeamPolicy(quota_gpus=8, borrow_gpus=4), "b": TeamPolicy(quota_gpus=8)})
    run(s, 0, gpus("a1", 8, team="a"))
    run(s, 0, gpus("a2", 4, team="a"))
    res = run(s, 0, gpus("a3", 2, team="a"))
    assert sorted(s.running) == ["a1", "a2"]
    assert [s.running[n].borrowed for n in ("a1", "a2")] == [False, True]
    why = res.pending["a3"]
    assert why.code == "Quota"
    assert "holds 12 GPUs of its quota_gpus 8 + borrow_gpus 4" in why.message
    # a hard quota (borrow 0, the default) keeps the team at its guarantee
    s = sched({"a": TeamPolicy(quota_gpus=8), "b": TeamPolicy(quota_gpus=8)})
    run(s, 0, gpus("a1", 8, team="a"))
    res = run(s, 0, gpus("a2", 4, team="a"))
    assert list(s.running) == ["a1"]
    assert res.pending["a2"].code == "Quota"


def _borrowed_cluster(**preemption) -> Scheduler:
    """Team a (guarantee 8, borrows freely) holds both hosts: a1 (8 GPUs, guaranteed) on
    one, borrowed a2 (4 GPUs, from t=0), a3 (2, from 100) and a4 (2, from 200) on the
    other. Team b has a guarantee of 8 and holds nothing."""
    s = sched({"a": TeamPolicy(quota_gpus=8, borrow_gpus=None), "b": TeamPolicy(quota_gpus=8)},
              preemption)
    run(s, 0, gpus("a1", 8, team="a"))
    run(s, 0, gpus("a2", 4, team="a"))
    run(s, 100, gpus("a3", 2, team="a"))
    run(s, 200, gpus("a4", 2, team="a"))
    assert [s.running[n].borrowed for n in ("a1", "a2", "a3", "a4")] == [
        False, True, True, True]
    return s


def test_reclaim_stops_exactly_the_cheapest_set_that_frees_a_placement():
    s = _borrowed_cluster()
    res = run(s, 1000, gpus("b1", 4, team="b"))
    # lost GPU-seconds: a2 4 x 1000, a3 2 x 900, a4 2 x 800: a3 + a4 (3400) free 4 GPUs on
    # the host more cheaply than a2 (4000); a1 is guaranteed work
    assert sorted(p.victim.name for p in res.preempted) == ["a3", "a4"]
    assert {p.reason for p in res.preempted} == {"reclaim"}
    assert all(p.by.name == "b1" for p in res.preempted)
    why = res.pending["b1"]
    assert why.code == "Preempting" and why.details["victims"] == ["a4", "a3"]
    assert "a3" in why.message and "a4" in why.message
    assert not res.started
    # the victims hold their GPUs until they have stopped (signal + grace: 30 s)
    stop_at = {p.stop_at for p in res.preempted}
    assert stop_at == {1030}
    assert s.stopping == {"a3": "b1", "a4": "b1"}
    res = run(s, 1010)
    assert not res.started and not res.preempted and res.pending["b1"].code == "Preempting"
    for name in ("a3", "a4"):
        s.requeue(name, 1020)
    res = run(s, 1020)
    assert [j.name for j, _ in res.started] == ["b1"]
    assert not s.running["b1"].borrowed
    assert hosts_of(s, "b1") == hosts_of(s, "a2")
    # the victims wait, with the preemptor remembered
    assert s.queue.jobs["a3"].preempted_by == {"b1"}
    assert s.queue.jobs["a3"].submit == 100


def test_checkpoints_make_the_older_job_the_cheaper_victim():
    s = sched({"a": TeamPolicy(quota_gpus=8, borrow_gpus=None), "b": TeamPolicy(quota_gpus=8)})
    run(s, 0, gpus("a1", 8, team="a"))
    run(s, 0, gpus("a2", 4, team="a"))
    run(s, 100, gpus("a3", 4, team="a"))
    for name in ("a2", "a3"):    # checkpoints every 600 s
        s.running[name].checkpoint_interval = 600
    # at 1000: a2 lost 400 s since its checkpoint at 600, a3 300 s since 700
    res = run(s, 1000, gpus("b1", 4, team="b"))
    assert [p.victim.name for p in res.preempted] == ["a3"]
    res = run(s, 1250, gpus("b2", 4, team="b"))
    # at 1250: a2 lost 50 s (checkpoint at 1200)
    assert [p.victim.name for p in res.preempted] == ["a2"]


def test_no_preemption_inside_the_minimum_run_time():
    s = _borrowed_cluster(min_run_time=600)
    res = run(s, 500, gpus("b1", 4, team="b"))     # a2 ran 500 s, a3 400, a4 300
    assert not res.preempted and res.pending["b1"].code != "Preempting"
    res = run(s, 800)                               # a2 800, a3 700, a4 600
    assert sorted(p.victim.name for p in res.preempted) == ["a3", "a4"]


def test_no_preemption_for_a_job_that_would_start_soon_anyway():
    s = sched({"a": TeamPolicy(quota_gpus=8, borrow_gpus=None), "b": TeamPolicy(quota_gpus=8)},
              {"min_saved_wait": 900, "min_run_time": 0})
    run(s, 0, gpus("a1", 8, team="a"))
    run(s, 0, gpus("a2", 8, 1500, team="a"))
    res = run(s, 1000, gpus("b1", 8, team="b"))   # a2 ends at 1500: 500 s away
    assert not res.preempted
    s = sched({"a": TeamPolicy(quota_gpus=8, borrow_gpus=None), "b": TeamPolicy(quota_gpus=8)},
              {"min_saved_wait": 300, "min_run_time": 0})
    run(s, 0, gpus("a1", 8, team="a"))
    run(s, 0, gpus("a2", 8, 1500, team="a"))
    res = run(s, 1000, gpus("b1", 8, team="b"))
    assert [p.victim.name for p in res.preempted] == ["a2"]


def test_priority_preemption_and_the_bands_it_may_not_touch():
    s = sched(preemption=URGENT)
    run(s, 0, gpus("low", 8), gpus("mid", 8, priority=100))
    res = run(s, 1000, gpus("urgent", 8, priority=150))
    # mid is in band 100: not below the rule's preempts_below
    assert [(p.victim.name, p.reason) for p in res.preempted] == [("low", "priority")]
    assert res.pending["urgent"].code == "Preempting"
    # a job of band 100 may not preempt band 100 (only lower ones)
    s = sched(preemption=URGENT)
    run(s, 0, gpus("x", 8, priority=100), gpus("y", 8, priority=100))
    res = run(s, 1000, gpus("z", 8, priority=100))
    assert not res.preempted


def test_no_preemption_when_the_preemptor_could_not_start_anyway():
    # 16 GPUs need both hosts; team x's job on one is guaranteed work, which priority
    # never takes: the low job on the other host is left alone
    s = sched({"x": TeamPolicy(quota_gpus=8)}, URGENT)
    run(s, 0, gpus("x1", 8, team="x"), gpus("low", 8, team="y"))
    assert not s.running["x1"].borrowed and s.running["low"].borrowed
    res = run(s, 1000, gpus("urgent", 16, team="z", priority=100))
    assert not res.preempted and "low" in s.running and not s.stopping
    # without x's guarantee both are fair game: both stop
    s = sched(preemption=URGENT)
    run(s, 0, gpus("x1", 8, team="x"), gpus("low", 8, team="y"))
    res = run(s, 1000, gpus("urgent", 16, team="z", priority=100))
    assert sorted(p.victim.name for p in res.preempted) == ["low", "x1"]


def test_a_job_never_preempts_the_job_that_preempted_it():
    s = sched(preemption=URGENT)
    run(s, 0, gpus("low", 8, priority=0), gpus("other", 8))
    res = run(s, 1000, gpus("urgent", 8, priority=100))
    victim = res.preempted[0].victim.name
    s.requeue(victim, 1030)
    assert [j.name for j, _ in run(s, 1030).started] == ["urgent"]
    assert s.queue.jobs[victim].preempted_by == {"urgent"}


# -- property: no ping-pong -------------------------------------------------------------

TEAMS = ("a", "b", "c")
EVENTS = st.lists(st.tuples(
    st.integers(0, 3000),                        # submit time
    st.sampled_from([1, 2, 4, 8, 16]),           # GPUs
    st.integers(200, 5000),                      # runtime
    st.sampled_from(TEAMS),
    st.sampled_from([0, 0, 0, 50, 100])),        # priority
    min_size=5, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS, st.sampled_from([None, 0, 8]), st.integers(0, 600))
def test_no_job_is_preempted_by_a_job_it_later_preempts(events, borrow, min_run):
    teams = {"a": TeamPolicy(quota_gpus=8, borrow_gpus=borrow),
             "b": TeamPolicy(quota_gpus=4, borrow_gpus=borrow)}     # c: no guarantee
    s = sched(teams, {"rules": [{"min_band": 50, "preempts_below": 50},
                                {"min_band": 100, "preempts_below": 100}],
                      "min_run_time": min_run, "min_saved_wait": 0})
    arrivals = sorted((t, i, n, r, team, prio) for i, (t, n, r, team, prio)
                      in enumerate(events))
    ends: dict[str, float] = {}          # running job -> when it ends (or is stopped)
    pairs: list[tuple[str, str]] = []    # (victim, preemptor) in order
    t, k = 0.0, 0
    while k < len(arrivals) or ends:
        t = min(arrivals[k][0] if k < len(arrivals) else math.inf, min(ends.values(),
                                                                       default=math.inf))
        for name in [n for n, e in ends.items() if e == t]:
            del ends[name]
            if name in s.stopping:
                s.requeue(name, t)
            else:
                s.finish(name, t)
        while k < len(arrivals) and arrivals[k][0] == t:
            _, i, n, r, team, prio = arrivals[k]
            k += 1
            try:
                s.submit(gpus(f"j{i}", n, r, team=team, priority=prio), t)
            except Rejected:       # more than the team may ever hold
                assert borrow is not None and n > teams[team].quota_gpus + borrow
        res = s.schedule(t, explain=True)
        for p in res.preempted:
            v = p.victim
            assert t - s.state.started[v.name] >= min_run        # never inside the minimum
            assert (p.by.name, v.name) not in pairs              # never back
            assert v.name not in p.by.preempted_by
            if p.reason == "priority":
                assert v.base < p.by.base
            else:
                assert v.borrowed and v.team != p.by.team
            pairs.append((v.name, p.by.name))
            ends[v.name] = p.stop_at
        for j, _ in res.started:
            ends[j.name] = t + j.runtime
        assert t < 10**7, "the stream never drains"
    # every job ran to its end (none left waiting forever)
    assert not s.queue.jobs and not s.running


def test_cpu_and_memory_quotas_join_gpu_quotas():
    s = sched({"etl": TeamPolicy(quota_cpus=16, quota_memory="64GiB"),
               "b": TeamPolicy(quota_gpus=8)})
    cpu = {"name": "w", "cpus": 8, "memory": "16GiB"}
    run(s, 0, job("e1", cpu, team="etl", expected_runtime=LONG))
    res = run(s, 0, job("e2", {**cpu, "cpus": 10}, team="etl", expected_runtime=LONG))
    why = res.pending["e2"]
    assert why.code == "Quota" and "holds 8 CPUs of its quota_cpus 16" in why.message
    res = run(s, 0, job("e3", {**cpu, "memory": "60GiB"}, team="etl",
                        expected_runtime=LONG))
    assert res.pending["e3"].code == "Quota" and "of memory" in res.pending["e3"].message
    with pytest.raises(Rejected, match="quota_cpus 16"):
        s.submit(job("e4", {**cpu, "cpus": 32}, team="etl"), 0)


def test_memory_quotas_take_cluster_sizes():
    team = TeamPolicy(quota_gpus=16, quota_memory="4TiB", borrow_memory="2TiB")
    assert (team.quota_memory, team.borrow_memory) == (4 * 2**40, 2 * 2**40)
    with pytest.raises(ValueError):
        TeamPolicy(quota_memory=-1)


@pytest.mark.parametrize("name", ["policy.yaml", "policy-preemption.yaml"])
def test_example_policy_files_load(name):
    policy = load_policy(str(REPO / "examples" / name))
    assert policy.preemption.reclaim and policy.teams


def test_an_urgent_job_at_its_teams_quota_preempts_the_teams_own_lower_band():
    # a hard quota of 8: the urgent job waits for the team's quota, not for GPUs (a host
    # is idle); priority makes room inside the quota by stopping the team's own low job
    s = sched({"a": TeamPolicy(quota_gpus=8), "b": TeamPolicy(quota_gpus=8)}, URGENT)
    run(s, 0, gpus("low", 8, team="a"))
    run(s, 0, gpus("b1", 4, team="b"))
    res = run(s, 1000, gpus("urgent", 8, team="a", priority=100))
    assert [(p.victim.name, p.reason) for p in res.preempted] == [("low", "priority")]
    assert res.pending["urgent"].code == "Preempting"
    s.requeue("low", 1030)
    assert [j.name for j, _ in run(s, 1030).started] == ["urgent"]
    # a job of the team's own band waits for the quota: nothing is stopped for it
    s = sched({"a": TeamPolicy(quota_gpus=8)}, URGENT)
    run(s, 0, gpus("x", 8, team="a"))
    res = run(s, 1000, gpus("y", 8, team="a"))
    assert not res.preempted and res.pending["y"].code == "Quota"
