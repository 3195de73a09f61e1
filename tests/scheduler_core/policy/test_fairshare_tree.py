"""Fair share over teams and their users (policy/fairshare.py): a team whose jobs name no
user keeps exactly the team's factor; users split their team's share and are ordered
under it (Slurm's depth-oblivious fair share); user shares and caps from the policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.fairshare import FairShare
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from tests.helpers import job, make_cluster


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]),
                       st.floats(0, 1e6, allow_nan=False), min_size=1),
       st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0.01, 100), max_size=3))
def test_teams_without_users_keep_the_team_formula(usage, shares):
    cfg = PolicyConfig.model_validate({"fairshare_weight": 100, "teams": {
        t: {"share": s} for t, s in shares.items()}})
    fs = FairShare(cfg)
    fs.usage = dict(usage)
    teams = set(usage) | {"a"}
    got, want = fs.terms(teams), fs.team_terms(teams)
    for t in teams:
        assert got[t] == pytest.approx(want[t]), t
        u, s, points = want[t]
        assert points == pytest.approx(100 * 2 ** (-u / s))


def test_users_split_their_teams_share_and_rank_under_it():
    cfg = PolicyConfig.model_validate({"fairshare_weight": 100, "teams": {
        "vision": {"users": {"alice": {"share": 3}}}}})
    fs = FairShare(cfg)
    fs.usage = {"vision/alice": 90.0, "vision/bob": 10.0, "nlp/carol": 5.0}
    t = fs.terms(["vision/alice", "vision/bob", "nlp/carol", "nlp/dave"])
    # vision's half of the shares splits 3:1; nlp's half 1:1 between its two users
    assert [round(t[a][1], 6) for a in ("vision/alice", "vision/bob", "nlp/carol",
                                         "nlp/dave")] == [0.375, 0.125, 0.25, 0.25]
    points = {a: p for a, (_, _, p) in t.items()}
    # nlp used little: both its users go before vision's; inside vision bob (10 % of
    # its usage for a quarter of its share) before alice
    assert min(points["nlp/carol"], points["nlp/dave"]) > points["vision/bob"] \
        > points["vision/alice"]
    assert points["nlp/dave"] > points["nlp/carol"]       # dave has used nothing yet
    team = fs.team_terms(["vision", "nlp"])
    # a user near its share in a team far over its own stays near the team's factor
    assert points["vision/bob"] == pytest.approx(team["vision"][2], rel=0.5)


def test_the_pass_orders_users_by_their_fair_share_and_caps_a_user():
    cfg = PolicyConfig.model_validate({"fairshare_weight": 100, "age_weight": 0,
                                       "size_weight": 0, "teams": {
                                           "vision": {"user_quota_gpus": 8}}})
    sched = Scheduler(ClusterState(make_cluster(
        {"name": "h[1-2]", "model": "dgx-a100", "rack": "r", "switch": "s"})), cfg)
    sched.fairshare.usage = {"vision/alice": 1e6, "vision/bob": 1e5}
    for name, user in (("a1", "alice"), ("b1", "bob"), ("a2", "alice")):
        sched.submit(job(name, {"name": "w", "gpus": 8}, team="vision", user=user,
                         expected_runtime="1h"), 0)
    order = [j.name for j, *_ in sched.priorities(0)]
    assert order.index("b1") < order.index("a1")
    r = sched.schedule(0, explain=True)
    assert {j.name for j, _ in r.started} == {"b1", "a1"}
    why = r.pending["a2"]
    assert why.code == "Quota" and "user 'alice' of team 'vision' holds 8 GPUs" in why.message
    assert why.details["user_quota_gpus"] == 8
