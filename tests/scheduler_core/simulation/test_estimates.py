"""Runtime estimates in replays: the trace's `expected_runtime` and `time_limit` columns,
`simulate --estimate-error` where a trace has neither, and what wrong estimates cost (a
backfilled job that overruns is stopped, requeued and run again; only a time limit ends a
job `timeout`)."""

from __future__ import annotations

import json
import math
from statistics import median

import pytest
import yaml

from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.estimates import (
    parse_estimate_error,
    with_estimates,
)
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob, load_trace
from tests.clirun import cli as run
from tests.helpers import make_cluster

TRACE = [TraceJob(f"j{i}", i * 60.0, 600.0 + 37 * i, 1 + i % 8) for i in range(2000)]
CLUSTER = {"cluster": "one", "hosts": [{"name": "h0", "model": "dgx-a100"}]}


def test_lognormal_estimates_are_fixed_by_the_job_id_and_exact_at_the_median():
    mode = parse_estimate_error("lognormal:0.5")
    got = with_estimates(TRACE, mode)
    assert got == with_estimates(TRACE, mode)                  # the same every replay
    ratios = sorted(t.expected_runtime / t.duration for t in got)
    assert 0.95 < median(ratios) < 1.05
    # sigma 0.5: about 16 % of jobs run more than exp(0.5) = 1.65x their estimate
    over = sum(r < math.exp(-0.5) for r in ratios) / len(ratios)
    assert 0.12 < over < 0.20
    assert all(t.time_limit is None for t in got)
    exact = with_estimates(TRACE, parse_estimate_error("exact"))
    assert [t.planned for t in exact] == [t.duration for t in TRACE]


def test_limit_mode_gives_hour_rounded_limits_in_its_range_and_plans_with_them():
    got = with_estimates(TRACE, parse_estimate_error("limit:1.5-10"))
    for t in got:
        assert t.expected_runtime is None and t.time_limit % 3600 == 0
        assert 1.5 * t.duration <= t.time_limit < 10 * t.duration + 3600
        assert t.planned == t.time_limit
    factors = [t.time_limit / t.duration for t in got]
    assert max(factors) > 5                                    # spread over the range


def test_a_traces_own_columns_are_kept(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("job_id,submit_time,duration,num_gpus,expected_runtime,time_limit\n"
                 "a,0,100,1,50,\nb,0,100,1,,7200\nc,0,100,1,,\n")
    trace = with_estimates(load_trace(p), parse_estimate_error("lognormal:2"))
    a, b, c = trace
    assert (a.expected_runtime, a.time_limit, b.expected_runtime, b.time_limit) == (
        50, None, None, 7200)
    assert c.expected_runtime is not None and c.expected_runtime != 100


@pytest.mark.parametrize("text", ["normal:1", "lognormal:x", "lognormal:-1", "limit:0.5-2",
                                  "limit:3-2", "limit:2", "exact:1", ""])
def test_a_bad_mode_names_the_flag_the_value_and_the_forms(text):
    with pytest.raises(InputError) as got:
        parse_estimate_error(text)
    said = str(got.value)
    assert "--estimate-error" in said and repr(text) in said
    assert "lognormal:SIGMA" in said and "limit:LO-HI" in said


def files(tmp_path, trace: str) -> list[str]:
    """simulate's arguments for the one-host cluster, a policy protecting the oldest
    blocked job at once (reserve_after 0) and `trace`."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "p.yaml").write_text("reserve_after: 0\n")
    (tmp_path / "t.csv").write_text(trace)
    return ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--policy-file",
            str(tmp_path / "p.yaml"), "--trace", str(tmp_path / "t.csv")]


def test_only_a_time_limit_ends_a_job_timeout(tmp_path):
    """One 8-GPU host: `a` (4 GPUs, 1000 s) runs; `big` (8 GPUs) is reserved from its end;
    `liar` says 100 s but runs 5000 and backfills: stopped at the reservation and run
    again, it ends once, never `timeout`; `capped` has a 1800 s limit for 3000 s of work:
    it ends `timeout`."""
    args = files(tmp_path, "job_id,submit_time,duration,num_gpus,expected_runtime,"
                 "time_limit\na,0,1000,4,,\nbig,1,500,8,,\nliar,2,5000,4,100,\n"
                 "capped,3,3000,4,,1800\n")
    r = run(*args, "--policy", "backfill", "--locality-slowdown", "1,1,1", "--json",
            "--records", str(tmp_path / "r.csv"))
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert (m["jobs"], m["timeouts"], m["overrun_stops"]) == (4, 1, 1), m
    assert m["lost_gpu_hours"] > 0
    rows = {r.split(",")[0]: r.split(",") for r in
            (tmp_path / "r.csv").read_text().splitlines()[1:]}
    assert float(rows["liar"][4]) == 2.0                        # its first start
    assert float(rows["liar"][5]) > 5000                        # ran its work again after


def test_simulate_reports_the_stops_of_overrunning_jobs(tmp_path):
    args = files(tmp_path, "job_id,submit_time,duration,num_gpus,expected_runtime\n"
                 "a,0,1000,4,\nbig,1,500,8,\nliar,2,5000,4,100\n")
    r = run(*args, "--policy", "backfill", "--estimate-error", "lognormal:0.5")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())                            # rich wraps lines
    assert "1 stops of backfilled jobs that overran their estimate" in out
    assert "0 jobs ended at their time limit" in out
    r = run(*args, "--estimate-error", "lognormal")
    assert r.returncode != 0 and "--estimate-error: 'lognormal'" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_backfilled_job_runs_on_when_the_job_it_would_yield_to_started_elsewhere():
    """Two 8-GPU hosts: `a` (4 GPUs on h0, 1000 s) and `b` (h1, says 2000 s, ends at 300);
    `big` (8 GPUs) is reserved on h0 from 1000; `liar` (says 100 s, runs 5000) backfills
    on h0's other 4 GPUs. `b` ends early and `big` starts on h1 at 300: at 1000 nothing
    needs liar's GPUs, so it runs on to its end, as the service lets it."""
    cluster = make_cluster({"name": "h[0-1]", "model": "dgx-a100", "switch": "s1"})
    trace = [TraceJob("a", 0, 1000, 4), TraceJob("b", 0, 300, 8, expected_runtime=2000),
             TraceJob("big", 1, 500, 8), TraceJob("liar", 2, 5000, 4, expected_runtime=100)]
    cfg = PolicyConfig(fairshare_weight=0, reserve_after=0, stop_grace=30)
    got = {r.job_id: r for r in simulate(cluster, trace, SimOptions(cfg, (1, 1, 1))).records}
    assert got["big"].start == 300
    liar = got["liar"]
    assert (liar.start, liar.end, liar.overrun_stops, liar.timeout) == (2, 5002, 0, False)
