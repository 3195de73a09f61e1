"""The victim search's bound on one host's candidates (victimsets.may_beat): exact cases,
and a property test that searching every host alone finds the same sets."""

from __future__ import annotations

import math
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy import victimsets
from airflow_gpu.scheduler_core.policy.config import PolicyConfig, TeamPolicy
from airflow_gpu.scheduler_core.policy.scheduler import Rejected, Scheduler
from airflow_gpu.scheduler_core.policy.victimsets import may_beat
from tests.helpers import job, make_cluster


def trial(gpus: int, replicas: int = 1, own_team: bool = False):
    return SimpleNamespace(job=SimpleNamespace(gpus=gpus, needs=[SimpleNamespace(
        replicas=replicas)]), own_team=own_team, freed=[])


def cand(cost: float, gpus: int, band: float = 0):
    return ((cost, band, 0.0, 0), SimpleNamespace(gpus=gpus), "priority")


def test_a_host_whose_gpus_cost_more_per_gpu_cannot_beat_the_best():
    cs = [cand(5000.0, 1), cand(5000.0, 1)]
    assert not may_beat(trial(2), cs, 0, (7200.0, 2, 0))
    assert may_beat(trial(2), cs, 0, (10001.0, 2, 0))
    # one GPU free there already: one candidate is enough
    assert may_beat(trial(2), cs, 1, (7200.0, 2, 0))


def test_on_a_tie_fewer_victims_then_lower_bands_may_beat():
    same = [cand(3600.0, 1), cand(3600.0, 1), cand(7200.0, 2)]
    assert not may_beat(trial(2), same[:2], 0, (7200.0, 2, 0))
    assert may_beat(trial(2), same, 0, (7200.0, 2, 0))           # one 2-GPU victim
    assert not may_beat(trial(2), same, 0, (7200.0, 1, 0))
    low = [cand(3600.0, 1, -5), cand(3600.0, 1)]
    assert may_beat(trial(2), low, 0, (7200.0, 2, 0))             # a lower band


def test_costs_that_are_not_whole_count_only_beyond_rounding():
    cs = [cand(0.1 * 3, 1), cand(0.1 * 3, 1)]
    assert may_beat(trial(2), cs, 0, (0.6, 2, 0))                 # 0.3 + 0.3: a tie
    assert not may_beat(trial(2), cs, 0, (0.5, 2, 0))


def test_only_a_job_of_one_replica_that_needs_the_host_is_bounded():
    cs = [cand(5000.0, 1), cand(5000.0, 1)]
    best = (7200.0, 2, 0)
    assert may_beat(trial(2, replicas=2), cs, 0, best)
    assert may_beat(trial(2, own_team=True), cs, 0, best)
    assert may_beat(trial(2), cs, 2, best)          # it lacks no GPU there
    assert not may_beat(trial(4), cs, 0, best)      # they cannot free enough


# -- property: the bound never changes a decision ----------------------------------------

HOSTS = ({"name": "dgx-[1-4]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
EVENTS = st.lists(st.tuples(
    st.integers(0, 2000),                        # submit time
    st.sampled_from([1, 1, 2, 4, 8]),            # GPUs
    st.integers(300, 4000),                      # runtime
    st.sampled_from("abc"),
    st.sampled_from([0, 0, 0, 100]),             # priority
    st.sampled_from([None, 300, 900])),          # checkpoint interval
    min_size=5, max_size=40)


def replay(events, bounded: bool) -> list:
    s = Scheduler(ClusterState(make_cluster(*HOSTS)), PolicyConfig(
        locality_slowdown=(1.0, 1.0, 1.0),
        teams={"a": TeamPolicy(quota_gpus=12, borrow_gpus=None),
               "b": TeamPolicy(quota_gpus=8, borrow_gpus=None)},
        preemption={"rules": [{"min_band": 100, "preempts_below": 100}],
                    "min_run_time": 0, "min_saved_wait": 0}))
    arrivals = sorted((t, i, *rest) for i, (t, *rest) in enumerate(events))
    ends: dict[str, float] = {}
    out, k = [], 0
    search_all = victimsets.may_beat
    if not bounded:
        victimsets.may_beat = lambda *_: True
    try:
        while k < len(arrivals) or ends:
            t = min(arrivals[k][0] if k < len(arrivals) else math.inf,
                    min(ends.values(), default=math.inf))
            for name in [n for n, e in ends.items() if e == t]:
                del ends[name]
                (s.requeue if name in s.stopping else s.finish)(name, t)
            while k < len(arrivals) and arrivals[k][0] == t:
                _, i, n, r, team, prio, every = arrivals[k]
                k += 1
                spec = job(f"j{i}", {"name": "w", "gpus": n}, expected_runtime=r,
                           team=team, priority=prio)
                try:
                    s.submit(spec, t)
                except Rejected:
                    continue
                s.queue.jobs[spec.name].checkpoint_interval = every
            res = s.schedule(t, explain=True)
            out.append((t, [(j.name, [a.gpu_mask for a in p.allocations])
                            for j, p in res.started],
                        [(p.victim.name, p.by.name, p.reason) for p in res.preempted],
                        {n: (w.code, w.message) for n, w in res.pending.items()}))
            for p in res.preempted:
                ends[p.victim.name] = p.stop_at
            for j, _ in res.started:
                ends[j.name] = t + j.runtime
            assert t < 10**7
    finally:
        victimsets.may_beat = search_all
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS)
def test_hosts_skipped_by_the_bound_would_not_have_won(events):
    assert replay(events, bounded=True) == replay(events, bounded=False)
