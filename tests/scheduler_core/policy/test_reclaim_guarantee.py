"""Reclaim against guarantees in the engine: gangs stop whole, so a reclaim keeps every
team at its guarantee whenever some set of victims allows it, and says so where none
does; a property test over random clusters checks the first part against every set."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.engine.placement import Placed, place
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig, TeamPolicy
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from tests.helpers import job, make_cluster
from tests.scheduler_core.policy.test_preemption import EXACT, LONG, gpus, run


def hosts(n: int) -> tuple[dict, ...]:
    return ({"name": f"dgx-[1-{n}]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


def sched(n_hosts: int, teams: dict, **preemption) -> Scheduler:
    return Scheduler(ClusterState(make_cluster(*hosts(n_hosts))), PolicyConfig(
        locality_slowdown=EXACT, teams=teams,
        preemption={"min_run_time": 0, "min_saved_wait": 0, **preemption}))


NLP = {"nlp": TeamPolicy(quota_gpus=24, borrow_gpus=None), "vision": TeamPolicy(quota_gpus=8)}


def _nlp_at_32(s: Scheduler) -> None:
    """nlp holds 32 GPUs: `a` (16, guaranteed) and `b` (16, of which 8 borrowed)."""
    run(s, 0, gpus("a", 16, team="nlp"))
    run(s, 1500, gpus("b", 16, team="nlp"))
    assert [s.running[n].borrowed for n in ("a", "b")] == [False, True]


def test_reclaim_prefers_a_victim_that_keeps_every_team_at_its_guarantee():
    # research (no guarantee) runs 8 GPUs since t=0; nlp's b is the cheaper victim (it
    # loses less work), but stopping it would leave nlp at 16 of its 24
    s = sched(5, {**NLP, "research": TeamPolicy()})
    run(s, 0, gpus("r", 8, team="research"))
    _nlp_at_32(s)
    res = run(s, 2000, gpus("v", 8, team="vision"))
    assert [(p.victim.name, p.reason, p.broken) for p in res.preempted] == [
        ("r", "reclaim", "")]
    assert "guarantee" not in res.pending["v"].message


def test_a_reclaim_that_has_to_break_a_guarantee_says_whose_and_for_whom():
    s = sched(4, NLP)
    _nlp_at_32(s)
    res = run(s, 2000, gpus("v", 8, team="vision"))
    (p,) = res.preempted
    assert (p.victim.name, p.reason) == ("b", "reclaim")
    broken = ("guarantee broken: team 'nlp' keeps 16 GPUs of its quota_gpus 24, for job v "
              "of team 'vision': a gang stops whole, and every set of borrowed jobs that "
              "frees room for it takes some team below its guarantee")
    assert p.broken == broken
    assert broken + (", and what is left is too little for this job to restart on (16 "
                     "GPUs)); SIGTERM") in p.message
    why = res.pending["v"]
    assert why.code == "Preempting" and broken in why.message
    assert why.details["guarantee_broken"] == ["nlp"]
    why = run(s, 2001).pending["v"]        # while b stops, v's reason still says so
    assert why.code == "Preempting" and broken in why.message


def test_a_victim_that_fits_in_what_is_left_is_told_it_may_restart():
    # six hosts: vision's x and y hold 4 GPUs each on dgx-5 and dgx-6, so v (8 GPUs on
    # one host) must reclaim; b (16 GPUs as 4 x 4) fits again on what v leaves
    s = sched(6, {**NLP, "vision": TeamPolicy(quota_gpus=16)})
    run(s, 0, gpus("a", 16, team="nlp"))
    run(s, 0, job("b", {"name": "w", "replicas": 4, "gpus": 4}, team="nlp",
                  expected_runtime=LONG))
    for name, host in (("x", "dgx-5"), ("y", "dgx-6")):
        run(s, 0, gpus(name, 4, team="vision", placement={"hosts": host}))
    assert sorted(s.running) == ["a", "b", "x", "y"] and s.running["b"].borrowed
    res = run(s, 2000, gpus("v", 8, team="vision"))
    (p,) = res.preempted
    assert p.victim.name == "b" and p.broken
    assert p.broken + ", and this job may restart on what is left); " in p.message


# -- the property ---------------------------------------------------------------------

TEAMS = {"a": TeamPolicy(quota_gpus=8, borrow_gpus=None),
         "b": TeamPolicy(quota_gpus=8, borrow_gpus=None),
         "c": TeamPolicy(share=1)}        # no guarantee: everything it runs is borrowed
SIZES = (1, 2, 4, 8, 16)


def _placeable(s: Scheduler, job, gone: list[str]) -> bool:
    state = s.state
    allocs = [a for n in gone for a in state.allocations[n]]
    for a in allocs:
        state.unhold(a)
    try:
        return isinstance(place(job.spec, state, s.reg, job.needs), Placed)
    finally:
        for a in allocs:
            state.hold(a)


def _below(held: dict[str, int], gone: list, team_of) -> bool:
    """Some team ends below min(its guarantee, what it holds) once `gone` stop."""
    left = dict(held)
    for v in gone:
        left[v.team] -= v.gpus
    return any(left[t] < min(held[t], TEAMS[t].quota_gpus)
               for t in held if TEAMS[t].quota_gpus is not None and team_of != t)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 3),
       st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(SIZES),
                          st.sampled_from((0, 100, 400))), min_size=1, max_size=8),
       st.sampled_from("ab"), st.sampled_from((1, 2, 4, 8)))
# c's 8 GPUs since t=0 cost more work than b's 16-GPU gang (8 of them borrowed) since 400
@example(3, [("c", 8, 0), ("b", 16, 400)], "a", 8)
def test_no_reclaim_takes_a_team_below_its_guarantee_when_a_set_exists_that_would_not(
        n_hosts, running, team, size):
    s = sched(n_hosts, TEAMS)
    s.config.preemption.reclaim = False        # the running jobs start as they fit
    now = 0
    for i, (t, n, gap) in enumerate(running):
        now += gap
        run(s, now, gpus(f"j{i}", n, team=t))
        if f"j{i}" not in s.running:
            s.finish(f"j{i}", now)             # it did not fit: not part of the picture
    s.config.preemption.reclaim = True
    held = {t: 0 for t in TEAMS}
    for j in s.running.values():
        held[j.team] += j.gpus
    victims = [j for j in s.running.values() if j.borrowed and j.team != team
               and held[j.team] > (TEAMS[j.team].quota_gpus or 0)]
    res = run(s, now + 100, gpus("r", size, team=team))
    r = s.queue.jobs.get("r") or s.running.get("r")
    if not res.preempted:
        return
    assert {p.reason for p in res.preempted} == {"reclaim"}
    gone = [p.victim for p in res.preempted]
    if not _below(held, gone, team):
        assert not any(p.broken for p in res.preempted)
        return
    # it broke a guarantee: no set of candidates that keeps them all lets r place
    assert any(p.broken for p in res.preempted)
    for k in range(1, len(victims) + 1):
        for subset in itertools.combinations(victims, k):
            if not _below(held, subset, team):
                assert not _placeable(s, r, [v.name for v in subset]), (
                    [v.name for v in subset], [v.name for v in gone])
