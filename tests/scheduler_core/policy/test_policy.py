"""The queue policy with exact runtimes on small clusters: reservations, backfill, fifo,
count, fair share, quotas, age, unhealthy parts and the pending reasons."""

from __future__ import annotations

import pytest

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig, TeamPolicy
from airflow_gpu.scheduler_core.policy.scheduler import Rejected, Scheduler
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.helpers import job, make_cluster

TWO_HOSTS = ({"name": "dgx-[1-2]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
EXACT = (1.0, 1.0, 1.0)   # no locality slowdown: runtimes are exactly the planned ones


def trace(*rows: tuple) -> list[TraceJob]:
    """(id, submit, duration, gpus[, team, priority]) rows."""
    out = []
    for i, row in enumerate(rows):
        jid, submit, duration, gpus, *rest = row
        team = rest[0] if rest else "t"
        prio = rest[1] if len(rest) > 1 else 0
        out.append(TraceJob(jid, submit, duration, gpus, team, prio, line=i + 2))
    return out


def starts(cluster_hosts, rows, mode="backfill", **policy) -> dict[str, float | None]:
    cfg = PolicyConfig(mode=mode, **{"locality_slowdown": EXACT, **policy})
    res = simulate(make_cluster(*cluster_hosts), trace(*rows), SimOptions(cfg, EXACT))
    return {r.job_id: r.start for r in res.records}


# A (8 GPUs) holds host 1 until 300, B (2) part of host 2 until 100. At 10 the 16-GPU
# job C arrives with a higher priority, then D (short) and E (long).
BACKFILL_ROWS = (("A", 0, 300, 8), ("B", 0, 100, 2), ("C", 10, 500, 16, "t", 10),
                 ("D", 10, 200, 4), ("E", 10, 1000, 2))


def test_reservation_and_backfill_exact_times():
    got = starts(TWO_HOSTS, BACKFILL_ROWS, reserve_after=0)
    # C, alone in its band, is protected at once: reserved for 300 (when A ends), it starts
    # exactly then; D ends at 210, before the reservation, so it backfills at once; E would
    # run past 300 on C's GPUs: it waits for C to end (300 + 500).
    assert got == {"A": 0, "B": 0, "C": 300, "D": 10, "E": 800}


def test_smaller_work_goes_first_until_the_wait_guarantee():
    # one host busy until 1000; then a big job (8 GPUs x 2000 s) and a stream of small
    # ones (1 GPU x 600 s, one every 100 s) wait
    rows = [("busy", 0, 1000, 8), ("big", 10, 2000, 8)] + [
        (f"s{i}", 20 + 100 * i, 600, 1) for i in range(40)]
    got = starts(ONE_HOST, rows, reserve_after=86400)
    # within the guarantee, small jobs go first and keep the host busy: the big one waits
    # for the stream to end
    assert all(got[f"s{i}"] < got["big"] for i in range(40))
    got = starts(ONE_HOST, rows, reserve_after=1500, reserve_after_scale=1)
    # once big has waited 1500 s (at 1510) it is protected: the host drains for it (small
    # jobs that would still run at its start wait) and it starts when the last one ends
    assert 1510 < got["big"] <= 1510 + 600
    assert sum(got[f"s{i}"] > got["big"] for i in range(40)) > 20
    # by default a job of the whole cluster waits 28 x reserve_after to be protected
    got = starts(ONE_HOST, rows, reserve_after=100)
    assert 10 + 2800 < got["big"] <= 10 + 2800 + 600


def test_a_larger_job_is_protected_later():
    """The wait before protection grows with the job's share of the cluster's GPUs: 1000 s
    for no GPU, 3000 s (scale 3) for all 16; the job due first is protected first."""
    s = _scheduler(reserve_after=1000, reserve_after_scale=3)
    s.submit(job("fill", {"name": "w", "replicas": 2, "gpus": 8}, expected_runtime=10**6), 0)
    s.schedule(0)
    s.submit(job("whole", {"name": "w", "replicas": 2, "gpus": 8}, expected_runtime=60), 0)
    s.submit(job("half", {"name": "w", "gpus": 8}, expected_runtime=60), 10)
    s.submit(job("one", {"name": "w", "gpus": 1}, expected_runtime=60), 20)
    due = {n: s.queue.protect_due(j) for n, j in s.queue.jobs.items()}
    assert due == {"whole": 2000, "half": 1010, "one": 20 + 2000 / 16}

    def protected(now: float) -> list[str]:
        return [j.name for j, p, _ in s.priorities(now) if p]
    assert protected(1144) == [] and protected(1145) == ["one"]
    s.finish("one", 1200)
    assert protected(2009) == [] and protected(2010) == ["half"]
    s.finish("half", 2100)
    assert protected(2999) == [] and protected(3000) == ["whole"]
    # not yet protected, a job says when it will be
    why = s.schedule(2500, explain=True).pending["whole"]
    assert why.details["protected_in_s"] == 500
    assert "the wait guarantee protects it (8m20s from now" in why.message


def test_fifo_short_jobs_wait_behind_the_big_one():
    got = starts(TWO_HOSTS, BACKFILL_ROWS, mode="fifo")
    assert got == {"A": 0, "B": 0, "C": 300, "D": 800, "E": 800}


def test_count_starves_the_big_job():
    # GPU counts only and no reservation: E takes two GPUs until 1010, so C waits for it.
    got = starts(TWO_HOSTS, BACKFILL_ROWS, mode="count")
    assert got == {"A": 0, "B": 0, "C": 1010, "D": 10, "E": 10}


def _scheduler(hosts=TWO_HOSTS, **policy) -> Scheduler:
    return Scheduler(ClusterState(make_cluster(*hosts)),
                     PolicyConfig(**{"locality_slowdown": EXACT, **policy}))


def gpus(name: str, n: int, runtime: int, **fields):
    roles = ({"name": "w", "replicas": n // 8, "gpus": 8} if n > 8
             else {"name": "w", "gpus": n})
    return job(name, roles, expected_runtime=runtime, **fields)


def test_pending_reasons_name_the_reservation_and_the_eta():
    s = _scheduler(reserve_after=0)
    s.submit(gpus("A", 8, 300), 0)
    s.submit(gpus("B", 2, 100), 0)
    assert [j.name for j, _ in s.schedule(0).started] == ["A", "B"]
    for spec in (gpus("C", 16, 500, priority=10), gpus("D", 4, 200), gpus("E", 2, 1000)):
        s.submit(spec, 10)
    res = s.schedule(10, explain=True)
    assert [j.name for j, _ in res.started] == ["D"]
    c, e = res.pending["C"], res.pending["E"]
    assert c.code == "Resources" and c.eta == 290
    assert "needs w 2x(8 GPUs" in c.message and "held by" in c.message
    assert sorted(c.details["reserved_hosts"]) == ["dgx-1", "dgx-2"]
    # the GPUs it holds back there: both hosts whole (C's 2 replicas of 8)
    assert c.details["reserved_gpus"] == {h: list(range(8)) for h in ("dgx-1", "dgx-2")}
    assert e.code == "Priority" and "'C'" in e.message and e.eta == 790
    # one protected job per band: C in band 10; D, the oldest of band 0, started
    assert [r.job.name for r in res.reservations] == ["C"]
    # the pass leaves exactly the started jobs' resources taken (holds are undone)
    fresh = ClusterState(s.state.cluster)
    for name in ("A", "B", "D"):
        fresh.commit(name, s.state.allocations[name])
    assert [h.free_gpus for h in fresh.hosts] == [h.free_gpus for h in s.state.hosts]
    assert [h.free_mem for h in fresh.hosts] == [h.free_mem for h in s.state.hosts]
    assert [h.free_cpus for h in fresh.hosts] == [h.free_cpus for h in s.state.hosts]


ONE_HOST = ({"name": "dgx-1", "model": "dgx-a100"},)


def test_fair_share_puts_the_heavier_team_second():
    rows = (("a1", 0, 1000, 8, "a"), ("a2", 10, 1000, 8, "a"), ("b1", 10, 1000, 8, "b"))
    got = starts(ONE_HOST, rows)
    assert got == {"a1": 0, "b1": 1000, "a2": 2000}
    # the control: without the fair-share term, arrival order decides
    got = starts(ONE_HOST, rows, fairshare_weight=0)
    assert got == {"a1": 0, "a2": 1000, "b1": 2000}


def test_fair_share_follows_configured_shares():
    # a uses 8000 GPU-seconds, b 4000; then both wait with one job each
    rows = (("a1", 0, 1000, 8, "a"), ("b0", 5, 500, 8, "b"), ("a2", 10, 1000, 8, "a"),
            ("b1", 10, 1000, 8, "b"))
    got = starts(ONE_HOST, rows)
    assert got == {"a1": 0, "b0": 1000, "b1": 1500, "a2": 2500}
    # with 50 shares to b's 1, a has used less than its share and b far more than its own
    got = starts(ONE_HOST, rows, teams={"a": TeamPolicy(share=50), "b": TeamPolicy(share=1)})
    assert got == {"a1": 0, "b0": 1000, "a2": 1500, "b1": 2500}


def test_quota_waits_while_others_run():
    s = _scheduler(teams={"vision": TeamPolicy(quota_gpus=8)})
    s.submit(gpus("v1", 8, 100, team="vision"), 0)
    s.submit(gpus("v2", 4, 100, team="vision"), 0)
    s.submit(gpus("n1", 4, 100, team="nlp"), 0)
    res = s.schedule(0, explain=True)
    # smaller work first: v2 (4 GPUs) starts, then v1 (8) would pass the quota
    assert [j.name for j, _ in res.started] == ["v2", "n1"]
    why = res.pending["v1"]
    assert why.code == "Quota"
    assert "holds 4 GPUs of its quota_gpus 8" in why.message and "needs 8 more" in why.message
    s.finish("v2", 100)
    assert [j.name for j, _ in s.schedule(100).started] == ["v1"]
    with pytest.raises(Rejected, match="quota_gpus 8"):
        s.submit(gpus("v3", 16, 100, team="vision"), 100)


def test_priority_bands_are_strict_and_age_orders_within_a_band():
    s = _scheduler(hosts=ONE_HOST, age_weight=1.0, size_weight=0, fairshare_weight=0,
                   reserve_after=3600)
    s.submit(gpus("busy", 8, 10_000), 0)
    s.schedule(0)
    s.submit(gpus("old", 8, 100, priority=1), 0)       # waited 3h at t=3h: protected
    s.submit(gpus("new", 8, 100, priority=3), 7200)
    s.submit(gpus("newer", 8, 100, priority=2), 9000)
    s.submit(gpus("new2", 8, 100, priority=3), 7000)   # 200 s older than "new"
    s.finish("busy", 10_800)
    res = s.schedule(10_800, explain=True)
    # the highest band first, whatever the age or the wait guarantee of lower bands
    assert [j.name for j, _ in res.started] == ["new2"]
    assert list(res.pending) == ["new", "newer", "old"]


def test_unhealthy_gpus_make_a_job_wait_with_reason():
    s = _scheduler(hosts=ONE_HOST)
    s.state.set_unhealthy_gpus("dgx-1", [3])
    s.submit(gpus("whole", 8, 100), 0)
    s.submit(gpus("seven", 7, 100), 0)
    res = s.schedule(0, explain=True)
    assert [j.name for j, _ in res.started] == ["seven"]
    why = res.pending["whole"]
    assert why.code == "Unhealthy" and "dgx-1" in why.message


def test_job_larger_than_cluster_is_rejected_at_submit():
    s = _scheduler()
    with pytest.raises(Rejected, match="does not fit even on the empty cluster|asks"):
        s.submit(gpus("huge", 24, 100), 0)
    assert len(s.queue) == 0


def test_cancel_pending_and_running():
    s = _scheduler(hosts=ONE_HOST)
    s.submit(gpus("a", 8, 100), 0)
    s.submit(gpus("b", 8, 100), 0)
    s.schedule(0)
    s.finish("b", 5)          # cancelled while pending
    s.finish("a", 6)          # cancelled while running
    assert len(s.queue) == 0 and not s.state.allocations
    assert s.state.usable_total == 8
