"""MIG devices are charged like GPUs: each as its share of its GPU (compute slices / 7) in
team quotas, borrowing, fair share, the `count` policy and the simulator. (The helpers new
with this are imported where used, so that the other tests fail on behaviour, not import,
on code without them.)"""

from __future__ import annotations

from fractions import Fraction

import pytest

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.plugins import default_registry
from airflow_gpu.scheduler_core.policy.config import PolicyConfig, TeamPolicy
from airflow_gpu.scheduler_core.policy.scheduler import Rejected, Scheduler
from airflow_gpu.scheduler_core.service.core import spec_gpus
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.helpers import job, make_cluster

# GPUs 0-1: 3g.20gb + 2g.10gb + 2g.10gb; GPU 2: seven 1g.5gb; GPUs 3-7 whole
MIG_HOST = {"name": "dgx-m", "model": "dgx-a100", "rack": "r1", "switch": "s1",
            "mig": [{"gpus": [0, 1], "layout": ["3g.20gb", "2g.10gb", "2g.10gb"]},
                    {"gpus": [2], "layout": {"1g.5gb": 7}}]}


def mig_job(name, profile="3g.20gb", count=1, team="vision", runtime="1h", **fields):
    return job(name, {"name": "v", "cpus": 2, "memory": "4GiB",
                      "gpu": {"mig": {"profile": profile, "count": count}}},
               team=team, expected_runtime=runtime, **fields)


def scheduler(**policy) -> Scheduler:
    return Scheduler(ClusterState(make_cluster(MIG_HOST)), PolicyConfig(**policy),
                     default_registry())


def started(s: Scheduler, now: float = 0) -> list[str]:
    return [j.name for j, _ in s.schedule(now, explain=True).started]


def test_a_mig_device_is_charged_its_compute_slices_over_seven():
    from airflow_gpu.scheduler_core.engine.mig import gpu_share
    from airflow_gpu.scheduler_core.policy.quota import charged_gpus

    assert gpu_share("3g.40gb") == Fraction(3, 7) and gpu_share("7g.80gb") == 1
    assert charged_gpus(mig_job("a", "1g.5gb", count=7)) == 1       # exact: not 0.999...
    assert charged_gpus(mig_job("b", "2g.10gb", count=2)) == Fraction(4, 7)
    assert charged_gpus(job("w", {"name": "w", "gpus": 2})) == 2
    # the stored spec (fair share of ended jobs): a profile alone, or profile and count
    assert spec_gpus({"roles": [{"replicas": 2, "gpu": {"mig": "1g.5gb"}}]}) == \
        pytest.approx(2 / 7)
    assert spec_gpus({"roles": [{"gpu": {"mig": {"profile": "3g.20gb", "count": 2}}},
                                {"gpus": 1}]}) == pytest.approx(1 + 6 / 7)


def test_a_team_quota_stops_mig_jobs_by_their_share():
    s = scheduler(teams={"vision": TeamPolicy(quota_gpus=1)})
    for i in range(3):
        s.submit(mig_job(f"v{i}"), i)                     # 3/7 GPU each
    assert started(s, 3) == ["v0", "v1"]                   # 6/7 held; a third is 9/7
    why = s.schedule(3, explain=True).pending["v2"]
    assert why.code == "Quota", why.message
    assert "holds 0.8571 GPUs of its quota_gpus 1" in why.message
    assert "needs 0.4286 more" in why.message
    assert why.details["held_gpus"] == 0.8571
    # seven 1g devices make exactly one GPU: all seven fit a quota of 1 on their own
    s = scheduler(teams={"vision": TeamPolicy(quota_gpus=1)})
    for i in range(8):
        s.submit(mig_job(f"s{i}", "1g.5gb"), 0)
    assert len(started(s)) == 7
    # more than the team may ever hold is refused at submit, naming the quota
    with pytest.raises(Rejected, match="needs 1.2857 GPUs but team 'vision' may hold at "
                                       "most quota_gpus 1"):
        s.submit(mig_job("big", count=3), 0)


def test_borrowing_charges_mig_devices_too():
    s = scheduler(teams={"vision": TeamPolicy(quota_gpus=0, borrow_gpus=1)})
    for i in range(3):
        s.submit(mig_job(f"v{i}"), 0)
    assert started(s) == ["v0", "v1"]
    assert all(s.running[n].borrowed for n in ("v0", "v1"))


def test_fair_share_counts_mig_devices_by_share():
    s = scheduler()
    s.submit(mig_job("a", "1g.5gb", count=7, team="a"), 0)
    s.submit(mig_job("b", "3g.20gb", team="b"), 0)
    assert sorted(started(s)) == ["a", "b"]
    s.fairshare.advance(3600)
    usage = s.fairshare.usage
    assert usage["a"] == pytest.approx(7 / 3 * usage["b"])   # 1 GPU against 3/7
    assert usage["a"] > 0.99 * 3600 * 0.5                    # decayed, but about 1 GPU-h


def test_count_policy_hands_out_mig_devices():
    s = scheduler(mode="count")
    for i in range(3):
        s.submit(mig_job(f"m{i}", "1g.5gb", count=3), 0)
    res = s.schedule(0, explain=True)
    assert [j.name for j, _ in res.started] == ["m0", "m1"]     # 7 devices: 3 + 3
    slots = [a.slice_mask for j, placed in res.started for a in placed.allocations]
    assert all(slots) and slots[0] & slots[1] == 0
    assert res.pending["m2"].code == "Resources"
    assert "3 MIG 1g.5gb devices" in res.pending["m2"].message


def test_the_simulator_charges_mig_devices_held():
    trace = [TraceJob(f"v{i}", 0, 3600, 1, "vision") for i in range(2)]
    res = simulate(make_cluster(MIG_HOST), trace,
                   SimOptions(PolicyConfig(), spec_of=lambda t: mig_job(t.job_id)))
    assert [r.held_gpu_s for r in res.records] == pytest.approx([3 / 7 * 3600] * 2)
    assert max(res.busy) == pytest.approx(6 / 7)
