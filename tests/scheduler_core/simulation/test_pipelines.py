"""Pipelines in a replay: trace columns dag_run, upstream and deadline; jobs submitted
once their upstream jobs end, the downstream work the scheduler is told, and the
deadline metrics."""

from __future__ import annotations

import json

import pytest

from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.pipelines import downstream, earliest_ends
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import load_trace
from tests.clirun import cli as run
from tests.helpers import make_cluster

EXACT = (1.0, 1.0, 1.0)
ONE_HOST = make_cluster({"name": "dgx-1", "model": "dgx-a100"})
HEAD = "job_id,submit_time,duration,num_gpus,dag_run,upstream,deadline\n"

# one host: bg1 holds it all 0-1000; the pipeline etl -> train -> val, due at 2000;
# train's submit time (50) comes before etl ends
PIPE = HEAD + ("bg1,0,1000,8,,,\n"
               "etl,10,100,2,n1,,2000\n"
               "train,50,300,8,n1,etl,2000\n"
               "val,0,50,1,n1,train,2000\n")


def write(tmp_path, text: str, name: str = "trace.csv") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def replay(tmp_path, text: str, **policy):
    cfg = PolicyConfig(locality_slowdown=EXACT, **policy)
    res = simulate(ONE_HOST, load_trace(write(tmp_path, text)), SimOptions(cfg, EXACT))
    return res, {r.job_id: r for r in res.records}


def test_trace_columns(tmp_path):
    jobs = load_trace(write(tmp_path, HEAD + "a,0,10,1,d1,,\nb,0,10,1,d1,a,500\n"
                                      "c,0,10,1,d1,a;b,500\nd,0,10,1,,a b,\n"))
    by = {t.job_id: t for t in jobs}
    assert by["a"].upstream == () and by["a"].deadline is None and by["a"].dag_run == "d1"
    assert by["b"].upstream == ("a",) and by["b"].deadline == 500.0
    assert by["c"].upstream == ("a", "b") and by["d"].upstream == ("a", "b")
    assert by["d"].dag_run is None


@pytest.mark.parametrize("rows, words", [
    ("a,0,10,1,,x,\n", ["line 2", "'upstream'", "'x' is not a job of the trace"]),
    ("a,0,10,1,,a,\n", ["line 2", "cannot wait for itself"]),
    ("a,0,10,1,,b,\nb,0,10,1,,a,\n", ["'upstream'", "waits for itself through"]),
    ("a,0,10,1,,,soon\n", ["line 2", "'deadline'", "'soon' is not a number"]),
])
def test_bad_pipeline_columns(tmp_path, rows, words):
    with pytest.raises(InputError) as exc:
        load_trace(write(tmp_path, HEAD + rows))
    for w in words:
        assert w in str(exc.value)


def test_downstream_and_earliest_end_follow_the_longest_path(tmp_path):
    jobs = load_trace(write(tmp_path, HEAD + "a,0,100,1,p,,\nb,0,300,1,p,a,900\n"
                                      "c,0,50,1,p,a,900\nd,0,20,1,p,b;c,900\n"))
    assert downstream(jobs) == {"a": 320.0, "b": 20.0, "c": 20.0, "d": 0.0}
    assert earliest_ends(jobs) == {"p": 420.0}


def test_a_job_is_submitted_once_its_upstream_jobs_end(tmp_path):
    res, r = replay(tmp_path, PIPE)
    # bg1 holds the host until 1000
    assert (r["etl"].submit, r["etl"].start, r["etl"].end) == (10, 1000, 1100)
    # train's submit is etl's end, not its own submit time
    assert (r["train"].submit, r["train"].start, r["train"].end) == (1100, 1100, 1400)
    assert (r["val"].submit, r["val"].start, r["val"].end) == (1400, 1400, 1450)
    m = res.metrics()
    assert m["pipelines"] == 1 and m["pipelines_met"] == 1 and m["pipelines_infeasible"] == 0
    assert m["background_jobs"] == 1 and m["background_avg_wait_s"] == 0


def test_the_scheduler_is_told_each_jobs_downstream_work(tmp_path):
    seen = {}

    def observe(sched, done):
        for j in [*sched.queue.jobs.values(), *(j for j, _ in done.started)]:
            seen[j.name] = (j.spec.downstream, j.latest_start)

    cfg = PolicyConfig(locality_slowdown=EXACT)
    simulate(ONE_HOST, load_trace(write(tmp_path, PIPE)), SimOptions(cfg, EXACT),
             observe=observe)
    assert seen["etl"] == (350, 2000 - 100 - 350)
    assert seen["train"] == (50, 2000 - 300 - 50)
    assert seen["val"] == (0, 2000 - 50)


def test_a_rejected_upstream_job_rejects_the_jobs_after_it(tmp_path):
    _, r = replay(tmp_path, HEAD + "big,0,10,16,p,,100\nafter,0,10,1,p,big,100\n")
    assert r["big"].rejected
    assert r["after"].rejected == "upstream job 'big' was rejected"


# one host: `hold` keeps 4 GPUs; six short 4-GPU background jobs queue for the other 4
# (1-601, 601-1201, ...); at 100 the deadline job (4 GPUs, 1 h, due at 4800: latest start
# 1200) arrives, a larger job than each of them (it would go last by score)
URGENT = HEAD + ("hold,0,100000,4,,,\n"
                 + "".join(f"b{i},1,600,4,,,\n" for i in range(6))
                 + "dl,100,3600,4,n,,4800\n")


def test_deadline_ordering_meets_what_the_score_order_misses(tmp_path):
    res, r = replay(tmp_path, URGENT)
    # its slack (1,100 s) is under 2h: it goes ahead of the background jobs still queued
    assert r["dl"].start == 601 and res.metrics()["pipelines_met"] == 1
    res, r = replay(tmp_path, URGENT, deadline_slack=0)
    m = res.metrics()
    assert r["dl"].start == 3601 and m["pipelines_met"] == 0
    assert m["pipelines_late_p50_s"] == m["pipelines_late_p95_s"] == 3601 + 3600 - 4800
    # the background jobs waited less when the deadline job did not go first
    assert m["background_avg_wait_s"] < replay(tmp_path, URGENT)[0].metrics()[
        "background_avg_wait_s"]


def test_infeasible_and_missed_pipelines_are_told_apart(tmp_path):
    # p1 cannot end before 300 (its deadline 200): infeasible; p2 waits behind bg (misses)
    res, _ = replay(tmp_path, HEAD + "bg,0,1000,8,,,\np1,1,300,1,,,200\n"
                    "p2a,1,100,1,p2,,500\np2b,1,100,1,p2,p2a,500\n")
    m = res.metrics()
    assert (m["pipelines"], m["pipelines_met"], m["pipelines_infeasible"]) == (1, 0, 1)
    assert m["pipelines_late_p50_s"] == 1200 - 500


def test_simulate_prints_the_deadline_table(tmp_path):
    path = write(tmp_path, PIPE)
    out = run("simulate", "--trace", path, "--hosts", "1", "--model", "dgx-a100")
    assert "Deadlines" in out.stdout and "1 (100.0%)" in out.stdout
    got = json.loads(run("simulate", "--trace", path, "--hosts", "1", "--model", "dgx-a100",
                         "--json").stdout)
    assert got["pipelines_met"] == 1
    # bg1, the background, runs 0-1000 at once: its wait 0, its submit-to-end 1000
    assert (got["background_avg_wait_s"], got["background_avg_jct_s"]) == (0, 1000)
    assert got["background_preempted"] == 0


def test_nightly_pipelines_are_seeded_and_due_1_2_to_3_times_their_critical_path():
    from airflow_gpu.scheduler_core.simulation.nightly import pipelines

    jobs = pipelines(days=3, per_night=4, seed=7)
    assert jobs == pipelines(days=3, per_night=4, seed=7)
    assert jobs != pipelines(days=3, per_night=4, seed=8)
    runs: dict[str, list] = {}
    for t in jobs:
        runs.setdefault(t.dag_run, []).append(t)
    assert len(runs) == 12
    bounds = earliest_ends(jobs)
    for dag_run, ts in runs.items():
        assert 3 <= len(ts) <= 5
        start = ts[0].submit
        assert all(t.submit == start and t.deadline == ts[0].deadline for t in ts)
        assert all(u.startswith(dag_run + "-") for t in ts for u in t.upstream)
        ratio = (ts[0].deadline - start) / (bounds[dag_run] - start)
        assert 1.19 <= ratio <= 3.01


TWO_HOSTS = make_cluster({"name": "dgx-[1-2]", "model": "dgx-a100"})


@pytest.mark.parametrize("running, deadline, avoidable", [
    # dgx-2 is free at a's latest start (100): fifo keeps a behind big, the policy's miss
    ("bg1,0,400,8,,,\n", 150, 1),
    # dgx-2 busy too: the load's miss
    ("bg1,0,400,8,,,\nbg2,0,400,8,,,\n", 150, 0),
    # 7 GPUs free by count, 2 on dgx-1 and 5 on dgx-2: a (7 GPUs on one host) could not
    # have started
    ("bg1,0,400,6,,,\nbg2,0,400,3,,,\n", 150, 0),
])
def test_a_miss_is_avoidable_only_if_the_job_could_have_started_at_its_latest_start(
        tmp_path, running, deadline, avoidable):
    """Two 8-GPU hosts, fifo: `running` until 400; big (16 GPUs) waits for it at the head
    of the queue, and a (7 GPUs, 50 s, one host) behind big."""
    text = HEAD + running + f"big,1,100,16,,,\na,2,50,7,p,,{deadline}\n"
    cfg = PolicyConfig(mode="fifo", locality_slowdown=EXACT)
    res = simulate(TWO_HOSTS, load_trace(write(tmp_path, text)), SimOptions(cfg, EXACT))
    assert {r.job_id: r for r in res.records}["a"].start >= 500.0     # after big
    m = res.metrics()
    assert (m["pipelines_met"], m["pipelines"], m["pipelines_infeasible"]) == (0, 1, 0)
    assert m["pipelines_missed_avoidable"] == avoidable
    # a job that came after its latest start (its upstream ran late) is never the
    # policy's miss, whatever was free
    res.records[-1].submit = res.latest_starts["a"] + 1
    assert res.metrics()["pipelines_missed_avoidable"] == 0
