"""The locality time model: placement by expected completion, overdue jobs re-estimated,
and slowdown factors learned from what ran."""

from __future__ import annotations

import pytest

from airflow_gpu.scheduler_core.engine.cluster import synthetic_cluster
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.reservations import running_ends
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from airflow_gpu.scheduler_core.policy.timemodel import LocalityModel, reestimate
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.helpers import job, make_cluster

# two switches of two hosts each
FOUR = ({"name": "a[1-2]", "model": "dgx-a100", "rack": "r", "switch": "s1"},
        {"name": "b[1-2]", "model": "dgx-a100", "rack": "r", "switch": "s2"})


def whole_hosts(name: str, hosts: int, runtime: int):
    return job(name, {"name": "w", "replicas": hosts, "gpus": 8}, expected_runtime=runtime)


def busy_scheduler(**policy) -> Scheduler:
    """a1 busy until 100, b1 until 10,000: one host free under each switch."""
    s = Scheduler(ClusterState(make_cluster(*FOUR)), PolicyConfig(**policy))
    s.submit(whole_hosts("short", 1, 100), 0)
    s.schedule(0)
    for h in ("a1", "a2"):     # keep "long" off switch s1
        s.state.set_drained(h)
    s.submit(whole_hosts("long", 1, 10_000), 0)
    s.schedule(0)
    for h in ("a1", "a2"):
        s.state.set_drained(h, False)
    assert {n: a[0].host.name for n, a in s.state.allocations.items()} == {
        "short": "a1", "long": "b1"}
    return s


def test_a_gang_waits_for_one_switch_when_that_ends_earlier():
    s = busy_scheduler()
    s.submit(whole_hosts("gang", 2, 1000), 0)
    res = s.schedule(0, explain=True)
    # now across switches: ends at 1.3 x 1000 = 1300; at 100 under switch s1: 100 + 1100
    assert res.started == []
    why = res.pending["gang"]
    assert why.code == "Locality" and why.eta == 100
    assert "one switch" in why.message and "a1, a2" in why.message
    assert why.details["end_if_waiting_s"] == 1200
    assert why.details["end_if_started_now_s"] == 1300
    assert [(r.job.name, r.start, r.protected) for r in res.reservations] == [
        ("gang", 100, False)]
    # the reservation holds a2 for the gang: a job that would run past 100 goes elsewhere
    s.submit(job("one", {"name": "w", "gpus": 1}, expected_runtime=500), 1)
    assert [(j.name, p.hosts[0].name) for j, p in s.schedule(1).started] == [("one", "b2")]
    s.finish("short", 100, completed=True)
    started = s.schedule(100).started
    assert [(j.name, sorted(h.name for h in p.hosts)) for j, p in started] == [
        ("gang", ["a1", "a2"])]
    assert s.state.expected_end["gang"] == pytest.approx(100 + 1100)


def test_a_short_gang_starts_across_switches_when_waiting_costs_more():
    s = busy_scheduler()
    s.submit(whole_hosts("gang", 2, 100), 0)
    started = s.schedule(0).started
    # now: ends at 130; waiting for s1: 100 + 110
    assert [(j.name, sorted(h.name for h in p.hosts)) for j, p in started] == [
        ("gang", ["a2", "b2"])]
    assert s.state.expected_end["gang"] == pytest.approx(130)


def test_without_a_slowdown_nothing_waits_for_locality():
    s = busy_scheduler(locality_slowdown=(1.0, 1.0, 1.0))
    s.submit(whole_hosts("gang", 2, 1000), 0)
    assert [j.name for j, _ in s.schedule(0).started] == ["gang"]


def test_an_overdue_job_is_expected_to_run_on_as_long_as_it_overran():
    assert reestimate(0, 100, 50) == 100                  # not overdue: as planned
    assert reestimate(0, 100, 100) == 100 + 60            # due now: a minute at least
    assert reestimate(0, 1000, 1500) == 1500 + 500        # overran 500 s: 500 s more
    assert reestimate(0, 1000, 1010) == 1010 + 100        # a tenth of its plan at least
    s = busy_scheduler()
    # at 300 "short" (planned to end at 100) still runs: the walk plans with 300 + 200
    assert running_ends(s.state, 300) == [(500, "short"), (10_000, "long")]
    # across switches now ends at 300 + 3900; under s1 from 500 at 500 + 3300: it waits
    s.submit(whole_hosts("gang", 2, 3000), 300)
    res = s.schedule(300, explain=True)
    assert res.pending["gang"].code == "Locality"
    assert res.pending["gang"].eta == pytest.approx(200)


def test_the_model_learns_a_class_slowdown_relative_to_its_own_bias():
    m = LocalityModel((1.0, 1.1, 1.3))
    assert m.factors("pytorch") == (1.0, 1.1, 1.3)
    for _ in range(1000):
        # users of this class ask for twice the time they need; spread, it runs 1.5x
        m.observe("pytorch", 0, 2000, 1000)
        m.observe("pytorch", 2, 2000, 1500)
    one, switch, across = m.factors("pytorch")
    assert one == 1.0 and switch == 1.1          # never seen: the policy's factor
    assert across == pytest.approx(1.5, rel=0.02)
    assert m.factors("etl") == (1.0, 1.1, 1.3)   # other classes keep the policy's
    [report] = m.report()
    assert report["job_class"] == "pytorch"
    assert [t["samples"] for t in report["tiers"]] == [1000, 0, 1000]
    m.observe("pytorch", 2, 100, 0)               # not a runtime: ignored
    assert LocalityModel((1.0, 1.1, 1.3), learn=False).factors("pytorch") == (1.0, 1.1, 1.3)


def test_a_replay_learns_the_slowdown_it_simulates():
    """The policy plans with 1.1 / 1.3 but the cluster really runs spread gangs 1.4 / 2.0
    times longer: the engine learns it from the jobs that end."""
    cluster = synthetic_cluster(8, "dgx-a100", hosts_per_switch=2)
    trace = [TraceJob(f"j{i}", i * 50, 600 + 10 * (i % 7), (8, 16, 16, 24)[i % 4], line=i + 2)
             for i in range(400)]
    seen = []
    res = simulate(cluster, trace, SimOptions(PolicyConfig(), (1.0, 1.4, 2.0)),
                   observe=lambda s, _: seen.append(s.timemodel))
    factors = seen[-1].factors(None)
    assert factors[1] == pytest.approx(1.4, rel=0.05)
    assert factors[2] == pytest.approx(2.0, rel=0.05)
    assert res.metrics()["unfinished"] == 0
