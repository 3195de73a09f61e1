"""Pipelines that meet their deadlines (issue 30), through real Airflow (`dag.test()`) and
a real scheduler-core: a DAG's DeadlineAlert and the GPU work after each task reach the
scheduler as the job's `deadline` and `downstream`; the job whose slack is short goes
ahead of an older, higher-scored job of another team; a job that cannot make it says
DeadlineAtRisk in its task log while its deadline is still ahead."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

import pytest
import yaml

from airflow_gpu.operators.deadlines import stamp
from tests.e2e.conftest import DagRun, Scheduler


@pytest.fixture
def scheduler(tmp_path):
    """One host of 4 GPUs; a lease long enough that jobs no runner heartbeats (the
    blocker, the other team's) keep their GPUs."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"deadline_slack": "1h"}))
    s = Scheduler(tmp_path, lease_ttl=600, hosts=1, args=("--policy-file", str(policy)))
    yield s
    s.stop()


@pytest.fixture
def run_dag(dag_runs, scheduler):
    started: list[DagRun] = []

    def start(deadline_s: int, **env: str) -> DagRun:
        started.append(DagRun(dag_runs, scheduler, "gpu_deadline.py", "gpu_deadline",
                              DEADLINE_S=str(deadline_s), **env))
        return started[-1]

    yield start
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def submit(scheduler, name: str, gpus: int, **spec) -> str:
    job = scheduler.http.post("/api/v1/jobs", json={"spec": {
        "name": name, "roles": [{"name": "w", "gpus": gpus, "cpus": 1,
                                 "memory": "64MiB"}], **spec}}).raise_for_status().json()
    return job["id"]


def hold_every_gpu(scheduler) -> str:
    blocker = submit(scheduler, "blocker", 4)
    scheduler.wait_for(lambda: scheduler.job(blocker)["state"] == "admitted",
                       what="the blocker admitted")
    return blocker


def pending_job(scheduler, name: str, code: str | None = None) -> dict:
    def found():
        jobs = [j for j in scheduler.jobs(name=name) if j["state"] == "pending"
                and (j["pending"] or {}).get("code") and
                (code is None or j["pending"]["code"] == code)]
        return jobs and jobs[0]
    return scheduler.wait_for(found, timeout=120, what=f"{name} pending ({code or 'any'})")


def ended(run: DagRun) -> str:
    """The run's output once it ends. Not its DAG-RESULT: Airflow 3.3.2's `dag.test()`
    fails a DAG run with a DeadlineAlert as it succeeds (its DagRun.update_state looks
    the alerts up by id in a DAG that was never stored, "'dict' object has
    no attribute 'hex'"); a scheduler stores the DAG first and is not affected. The
    tasks' states are read from their jobs instead."""
    run.output, _ = run.proc.communicate(timeout=240)
    return run.output


def test_the_deadline_and_the_work_after_reach_the_scheduler_and_go_first(run_dag,
                                                                         scheduler):
    blocker = hold_every_gpu(scheduler)
    # older and less work (20 GPU-minutes, train 90): a higher score
    rival = submit(scheduler, "rival", 2, team="rival", expected_runtime="10m")
    run = run_dag(2 * 3600 + 600)                           # queued_at + 2h10m
    train = pending_job(scheduler, "gpu_deadline.train")
    spec = scheduler.job(train["id"])["spec"]
    deadline = datetime.fromisoformat(spec["deadline"])
    submitted = datetime.fromisoformat(train["submitted_at"])
    assert timedelta(hours=2, minutes=9) < deadline - submitted <= timedelta(hours=2,
                                                                           minutes=10)
    assert (spec["downstream"], spec["expected_runtime"]) == ("1h30m", "30m")
    # latest start: deadline - (30m + 1h30m), 10 minutes of slack, under deadline_slack
    queue = {e["id"]: e for e in scheduler.http.get("/api/v1/queue").json()}
    mine, theirs = queue[train["id"]], queue[rival]
    assert mine["band"] == theirs["band"] and theirs["score"] > mine["score"], queue
    assert mine["rank"] < theirs["rank"]
    scheduler.http.delete(f"/api/v1/jobs/{blocker}").raise_for_status()
    scheduler.wait_for(lambda: scheduler.job(train["id"])["state"] != "pending",
                       what="train admitted")
    scheduler.http.delete(f"/api/v1/jobs/{rival}").raise_for_status()   # for validate
    output = ended(run)
    (validate,) = scheduler.wait_for(lambda: scheduler.jobs(name="gpu_deadline.validate"),
                                     what="validate's job")
    for job in (train, validate):
        assert scheduler.job(job["id"])["state"] == "succeeded", output[-4000:]
    # the rival waited: 1 GPU was left beside train, it needs 2
    done, theirs = scheduler.job(train["id"]), scheduler.job(rival)
    assert theirs["admitted_at"] is None or theirs["admitted_at"] >= done["finished_at"]
    latest = stamp(deadline - timedelta(hours=2))
    assert (f"deadline {stamp(deadline)} (DAG run's DeadlineAlert: queued_at + 2h10m), "
            f"downstream 1h30m (validate): latest start {latest} (this job's runtime "
            "30m)") in output, output[-4000:]
    spec = scheduler.job(validate["id"])["spec"]
    assert (datetime.fromisoformat(spec["deadline"]), spec["downstream"]) == (deadline, "0s")


def test_a_hopeless_deadline_says_deadline_at_risk_in_the_task_log_before_it(run_dag,
                                                                           scheduler):
    hold_every_gpu(scheduler)
    run = run_dag(120, GPU_WAIT_TIMEOUT="5")              # 2 minutes for 2 hours of work
    train = pending_job(scheduler, "gpu_deadline.train", "DeadlineAtRisk")
    deadline = datetime.fromisoformat(scheduler.job(train["id"])["spec"]["deadline"])
    assert time.time() < deadline.timestamp()
    assert train["pending"]["details"]["cause"] == "Resources"
    result = run.result()
    assert result["tasks"] == {"train": "failed", "validate": "upstream_failed"}, \
        run.output[-4000:]
    said = re.search(r"waiting for GPUs.*: deadline at risk: its pipeline is due in "
                     r"\S+ and needs 2h from this job's start", run.output)
    assert said, run.output[-4000:]
    assert time.time() < deadline.timestamp()
