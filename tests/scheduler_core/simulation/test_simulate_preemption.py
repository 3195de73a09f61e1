"""`simulate` with preemption and quota borrowing: exact outcomes on tiny traces.

One 8-GPU host, no locality slowdown, stop grace 30 s (the preempt grace of jobs whose
class sets none). A preempted job holds its GPUs through the grace, then runs again
from its last checkpoint: what it loses is the time since that checkpoint, plus the
grace it spent stopping.
"""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.clirun import cli as run
from tests.helpers import make_cluster

ONE_HOST = {"name": "h0", "model": "dgx-a100", "rack": "r1", "switch": "s1"}
EXACT = (1.0, 1.0, 1.0)
PREEMPT = {"rules": [{"min_band": 100, "preempts_below": 100}], "min_run_time": 600,
           "min_saved_wait": 900}


def replay(rows, checkpoint: float | None = 1000, teams=None, preemption=None,
           signalled: list | None = None):
    """(id, submit, duration, gpus, team, priority) rows; returns (records, metrics);
    `signalled` gets (time, victim, preemptor, reason) of every preemption decided."""
    trace = [TraceJob(jid, submit, duration, g, team, prio, line=i + 2)
             for i, (jid, submit, duration, g, team, prio) in enumerate(rows)]
    cfg = PolicyConfig(locality_slowdown=EXACT, fairshare_weight=0, stop_grace=30,
                       teams=teams or {}, preemption=preemption or {"reclaim": False})

    def observe(_, done) -> None:
        if signalled is not None:
            signalled.extend((done.now, p.victim.name, p.by.name, p.reason)
                             for p in done.preempted)

    res = simulate(make_cluster(ONE_HOST), trace,
                   SimOptions(cfg, EXACT, checkpoint_interval=checkpoint), observe=observe)
    return {r.job_id: r for r in res.records}, res.metrics()


# low holds the host from 0 for 10,000 s; urgent (priority 100, 500 s) arrives at 3,500
URGENT = [("low", 0, 10_000, 8, "t", 0), ("urgent", 3500, 500, 8, "t", 100)]


def test_a_high_priority_job_preempts_and_the_victim_reruns_from_its_checkpoint():
    signalled: list = []
    got, m = replay(URGENT, preemption=PREEMPT, signalled=signalled)
    assert signalled == [(3500, "low", "urgent", "priority")]
    low, urgent = got["low"], got["urgent"]
    # low is signalled at 3,500 and gone at 3,530; urgent runs 3,530-4,030
    assert (urgent.start, urgent.end, urgent.preemptions) == (3530, 4030, 0)
    # low checkpointed at 1,000, 2,000 and 3,000: 500 s of work are lost (and the 30 s
    # grace); it runs its 7,000 s left from 4,030
    assert (low.start, low.end, low.preemptions) == (0, 11_030, 1)
    assert low.lost_gpu_s == 8 * (500 + 30)
    assert low.held_gpu_s == 8 * (3530 + 7000)
    assert (m["preemptions"], m["preempted_jobs"]) == (1, 1)
    assert m["lost_gpu_hours"] == pytest.approx(8 * 530 / 3600)
    assert m["lost_fraction"] == pytest.approx(530 / (3530 + 7000 + 500))
    assert (m["hi_jobs"], m["hi_avg_wait_s"], m["hi_p95_wait_s"]) == (1, 30, 30)
    # utilization counts every GPU-second held, the lost ones too
    assert m["gpu_utilization"] == pytest.approx((3530 + 7000 + 500) / 11_030)


def test_without_checkpoints_the_victim_loses_all_its_work():
    got, m = replay(URGENT, checkpoint=None, preemption=PREEMPT)
    assert got["low"].lost_gpu_s == 8 * (3500 + 30)
    assert got["low"].end == 4030 + 10_000
    assert got["urgent"].start == 3530


def test_without_preemption_the_urgent_job_waits():
    got, m = replay(URGENT)
    assert (got["urgent"].start, got["low"].end) == (10_000, 10_000)
    assert (m["preemptions"], m["lost_gpu_hours"], m["hi_avg_wait_s"]) == (0, 0, 6500)


def test_no_preemption_for_a_job_that_would_start_soon_or_within_the_min_run_time():
    # at 9,500 low ends in 500 s, within min_saved_wait (900): urgent waits for it
    got, _ = replay([URGENT[0], ("urgent", 9500, 500, 8, "t", 100)], preemption=PREEMPT)
    assert (got["urgent"].start, got["low"].preemptions) == (10_000, 0)
    # at 300 low has run less than min_run_time (600): it is preempted once it has
    got, _ = replay([URGENT[0], ("urgent", 300, 500, 8, "t", 100)], preemption=PREEMPT)
    assert got["low"].preemptions == 1
    assert got["urgent"].start == 630


def test_a_victim_that_ends_within_its_grace_just_ends():
    # min_saved_wait 0: at 3,500 urgent preempts low, which would end at 3,510 anyway,
    # before its grace is over (3,530): it ends then, and is neither requeued nor charged
    rows = [("low", 0, 3510, 8, "t", 0), URGENT[1]]
    signalled: list = []
    got, m = replay(rows, preemption={**PREEMPT, "min_saved_wait": 0}, signalled=signalled)
    assert signalled == [(3500, "low", "urgent", "priority")]
    assert (got["low"].end, got["low"].preemptions, got["low"].lost_gpu_s) == (3510, 0, 0)
    assert got["urgent"].start == 3510
    assert m["preemptions"] == 0


TEAMS = {"a": {"quota_gpus": 4, "borrow_gpus": None}, "b": {"quota_gpus": 4}}
BORROW = [("a1", 0, 10_000, 4, "a", 0), ("a2", 0, 10_000, 4, "a", 0)]


def test_borrowing_uses_idle_gpus_and_the_owner_reclaims_them():
    signalled: list = []
    got, m = replay(BORROW + [("b1", 2500, 1000, 4, "b", 0)], teams=TEAMS,
                    preemption={"reclaim": True}, signalled=signalled)
    assert signalled == [(2500, "a2", "b1", "reclaim")]
    a1, a2, b1 = got["a1"], got["a2"], got["b1"]
    # a holds b's idle quota from 0: a2 is borrowed
    assert (a1.start, a1.borrowed, a2.start, a2.borrowed) == (0, False, 0, True)
    # b submits at 2,500: a2 is stopped (gone at 2,530) and b1 starts on its GPUs
    assert (b1.start, b1.end, b1.borrowed) == (2530, 3530, False)
    assert a2.preemptions == 1 and a1.preemptions == 0
    # a2 saved 2,000 s at its checkpoints: it borrows again when b1 ends, for 8,000 s
    assert a2.lost_gpu_s == 4 * (500 + 30)
    assert a2.end == 3530 + 8000
    assert m["borrowed_jobs"] == 1 and m["preemptions"] == 1


def test_borrowing_without_reclaim_makes_the_owner_wait():
    got, _ = replay(BORROW + [("b1", 2500, 1000, 4, "b", 0)], teams=TEAMS)
    assert (got["a2"].start, got["a2"].preemptions, got["b1"].start) == (0, 0, 10_000)


def test_hard_quotas_keep_a_team_at_its_quota():
    teams = {"a": {"quota_gpus": 4}, "b": {"quota_gpus": 4}}
    got, m = replay(BORROW, teams=teams, preemption={"reclaim": True})
    # the other 4 GPUs stay idle: a2 waits for a1
    assert (got["a1"].start, got["a2"].start) == (0, 10_000)
    assert not got["a2"].borrowed and m["borrowed_jobs"] == 0
    assert m["gpu_utilization"] == pytest.approx(0.5)


def test_a_borrowing_limit_is_kept():
    teams = {"a": {"quota_gpus": 2, "borrow_gpus": 2}, "b": {"quota_gpus": 6}}
    rows = [(f"a{i}", 0, 1000, 2, "a", 0) for i in range(3)]
    got, _ = replay(rows, teams=teams)
    assert sorted(r.start for r in got.values()) == [0, 0, 1000]
    assert [r.job_id for r in got.values() if r.borrowed] == ["a1"]   # beyond 2 GPUs


def test_cli_checkpoint_interval_and_records(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "one", "hosts": [ONE_HOST]}))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"fairshare_weight": 0, "stop_grace": 30,
                                      "preemption": PREEMPT}))
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,duration,num_gpus,team,priority\n"
                     "low,0,10000,8,t,0\nurgent,3500,500,8,t,100\n")
    records = tmp_path / "records.csv"
    args = ("simulate", "--cluster", str(cluster), "--trace", str(trace), "--policy-file",
            str(policy), "--locality-slowdown", "1,1,1")
    out = run(*args, "--checkpoint-interval", "1000", "--json", "--records", str(records))
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    assert (m["preemptions"], m["hi_jobs"], m["hi_p95_wait_s"]) == (1, 1, 30)
    assert m["lost_gpu_hours"] == pytest.approx(8 * 530 / 3600)
    rows = {r["job_id"]: r for r in csv.DictReader(records.open())}
    assert (rows["low"]["preemptions"], float(rows["low"]["lost_gpu_s"])) == ("1", 4240)
    # the default: every 30 minutes (the checkpoint at 1,800 s: 1,700 s lost)
    out = run(*args, "--json")
    assert json.loads(out.stdout)["lost_gpu_hours"] == pytest.approx(8 * 1730 / 3600)
    out = run(*args)
    assert out.returncode == 0 and "preemptions 1," in out.stdout, out.stderr
    assert "high-priority jobs wait" in out.stdout
    out = run(*args, "--checkpoint-interval", "often")
    assert out.returncode == 2 and "--checkpoint-interval" in out.stderr
