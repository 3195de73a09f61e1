"""`airflow-gpu simulate` as users run it: traces, bad input, metrics, plots, and the
plan's ETA against the replay."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from tests.clirun import cli as run
from tests.helpers import REPO

DATA = REPO / "tests" / "data"
CLUSTER = {"cluster": "two", "hosts": [
    {"name": "dgx-[1-2]", "model": "dgx-a100", "rack": "r1", "switch": "s1"}]}


def write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.fixture
def cluster_file(tmp_path):
    return write(tmp_path, "cluster.yaml", yaml.safe_dump(CLUSTER))


@pytest.mark.parametrize("text, expected", [
    ("job_id,submit_time,num_gpus\na,0,1\n", "line 1: missing column 'duration'"),
    ("job_id,submit_time,duration,num_gpus\na,0,10,1\nb,5,ten,1\n",
     "line 3: column 'duration': 'ten' is not a number"),
    ("job_id,submit_time,duration,num_gpus\na,-4,10,1\n",
     "line 2: column 'submit_time': '-4' must be 0 or more"),
    ("job_id,submit_time,duration,num_gpus\na,0,10,0\n",
     "line 2: column 'num_gpus': '0' must be greater than 0"),
    ("job_id,submit_time,duration,num_gpus\na,0,10,1\na,1,10,1\n",
     "line 3: column 'job_id': 'a' appears twice"),
    ("job_id,submit_time,duration,num_gpus,teams\na,0,10,1,x\n",
     "unknown column 'teams' (did you mean 'team'?)"),
    ("job_id,submit_time,duration,num_gpus\na,0,10\n", "line 2: 3 values for 4 columns"),
])
def test_bad_trace_names_the_line(tmp_path, cluster_file, text, expected):
    trace = write(tmp_path, "t.csv", text)
    out = run("simulate", "--cluster", cluster_file, "--trace", trace)
    assert out.returncode == 2, out.stdout
    assert expected in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, expected", [
    (["--policy", "sjf"], "--policy: unknown policy 'sjf'"),
    (["--locality-slowdown", "1,2"], "--locality-slowdown: '1,2' is not three positive"),
    (["--hosts", "0"], "hosts: 0 is not a positive number"),
    (["--hosts", "4", "--model", "dgx-9"], "dgx-9"),
])
def test_bad_options_are_clear(tmp_path, args, expected):
    trace = write(tmp_path, "t.csv", "job_id,submit_time,duration,num_gpus\na,0,10,1\n")
    out = run("simulate", "--trace", trace, *args)
    assert out.returncode == 2 and expected in out.stderr, out.stderr


def test_job_larger_than_the_cluster_is_reported_as_rejected(tmp_path, cluster_file):
    trace = write(tmp_path, "t.csv", "job_id,submit_time,duration,num_gpus\n"
                  "a,0,10,8\nhuge,1,10,24\nb,2,10,8\n")
    records = tmp_path / "records.csv"
    out = run("simulate", "--cluster", cluster_file, "--trace", trace, "--json",
              "--records", str(records))
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    assert m["jobs"] == 2 and m["rejected"] == 1 and m["unfinished"] == 0
    rows = {r["job_id"]: r for r in csv.DictReader(records.open())}
    why = rows["huge"]["rejected"]
    assert "3x(8 GPUs" in why and "16 eligible GPUs" in why
    assert rows["huge"]["start"] == ""


def test_json_contract_and_plots_on_a_philly_slice(tmp_path):
    plots = tmp_path / "plots"
    out = run("simulate", "--hosts", "4", "--hosts-per-switch", "2",
              "--trace", str(DATA / "philly-head-300.csv"), "--limit", "300",
              "--policy", "all", "--json", "--plot", str(plots))
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [r["policy"] for r in results] == ["fifo", "count", "backfill"]
    for r in results:
        assert {"jobs", "avg_jct_s", "avg_wait_s", "p95_wait_s", "makespan_s",
                "gpu_utilization", "multi_gpu_jobs_min_hosts_frac", "policy",
                "makespan_lower_bound_s", "avg_jct_lower_bound_s", "avg_wait_large_s",
                "max_wait_s"} <= set(r)
        assert r["jobs"] + r["rejected"] == 300 and r["unfinished"] == 0
        assert 0 < r["gpu_utilization"] <= 1
        assert r["avg_jct_s"] >= r["avg_jct_lower_bound_s"]
        assert r["makespan_s"] >= r["makespan_lower_bound_s"]
        assert 0 <= r["avg_wait_s"] <= r["p95_wait_s"] or r["p95_wait_s"] == 0
    fifo, count, backfill = results
    assert backfill["avg_wait_s"] <= fifo["avg_wait_s"]
    assert fifo["multi_gpu_jobs_min_hosts_frac"] == 1.0          # topology-aware packing
    for name in ("wait_cdf.png", "utilization.png", "queue_length.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_output(tmp_path, cluster_file):
    trace = write(tmp_path, "t.csv", "job_id,submit_time,duration,num_gpus\na,0,10,8\n")
    out = run("simulate", "--cluster", cluster_file, "--trace", trace)
    assert out.returncode == 0, out.stderr
    assert "backfill" in out.stdout and "bound" in out.stdout


def test_plan_eta_is_when_the_replay_starts_the_job(tmp_path, cluster_file):
    """Exact runtimes, nothing new arriving: `plan`'s ETA of each reserved job is the time
    `simulate` starts it."""
    rows = [("A", 8, 300), ("B", 2, 100), ("C", 16, 500), ("D", 4, 200), ("E", 2, 1000)]

    def roles(n):
        whole, rest = divmod(n, 8)
        out = [{"name": "worker", "replicas": whole, "gpus": 8, "cpus": 32,
                "memory": "256GiB"}] if whole else []
        if rest:
            out.append({"name": "worker", "gpus": rest, "cpus": 4 * rest,
                        "memory": f"{32 * rest}GiB"})
        return out

    jobs = {"jobs": [{"name": n, "team": "t", "expected_runtime": rt, "roles": roles(g)}
                     for n, g, rt in rows]}
    jobs_file = write(tmp_path, "jobs.yaml", yaml.safe_dump(jobs))
    trace = write(tmp_path, "t.csv", "job_id,submit_time,duration,num_gpus,team\n" + "".join(
        f"{n},0,{rt},{g},t\n" for n, g, rt in rows))
    out = run("plan", "--cluster", cluster_file, "--jobs", jobs_file, "--json")
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    # smaller work first; C waits for two whole hosts, when E ends
    assert [j["job"] for j in planned["admitted"]] == ["B", "D", "E", "A"]
    etas = {p["job"]: p["eta_seconds"] for p in planned["pending"]}
    assert etas == {"C": 1000}

    records = tmp_path / "records.csv"
    out = run("simulate", "--cluster", cluster_file, "--trace", trace, "--locality-slowdown",
              "1,1,1", "--records", str(records), "--json")
    assert out.returncode == 0, out.stderr
    started = {r["job_id"]: float(r["start"]) for r in csv.DictReader(records.open())}
    assert {j: started[j] for j in etas} == etas
    assert all(started[j["job"]] == 0 for j in planned["admitted"])
