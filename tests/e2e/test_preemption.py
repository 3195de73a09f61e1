"""Priority preemption end to end: real Airflow tasks (dag.test), the real scheduler-core
with a preemption rule, a real Docker engine. A low-priority training container is
preempted by an urgent one: it gets SIGTERM and its grace to checkpoint, its job is
requeued under the same id, its task defers again and finishes on another host as a
restarted attempt."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.e2e.conftest import Scheduler

POLICY = {"preemption": {"min_run_time": 0, "min_saved_wait": 0,
                         "rules": [{"min_band": 100, "preempts_below": 100}]}}


@pytest.fixture
def scheduler(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    s = Scheduler(tmp_path, lease_ttl=4, hosts=2, args=("--policy-file", str(policy)))
    yield s
    s.stop()


def seen(output: str) -> dict[str, str]:
    return dict(re.findall(r"\[main-0\] (AIRFLOW_GPU_[A-Z_]+)=(\S*)", output))


def test_a_preempted_container_checkpoints_requeues_and_resumes_elsewhere(
        run_dag, scheduler, tmp_path):
    mount = f"{tmp_path}:/signal"

    def start(priority: int, done: str):
        return run_dag("gpu_preempt.py", "gpu_preempt", TEST_PRIORITY=str(priority),
                       DONE_FILE=done, TEST_MOUNT=mount)

    def running(n: int):
        return lambda: len(scheduler.jobs(state="running")) == n and scheduler.jobs(
            state="running")

    low = start(0, "low-done")
    (low_job,) = scheduler.wait_for(running(1), what="the low job running")
    first_host = scheduler.job(low_job["id"])["replicas"][0]["host"]
    other = start(100, "other-done")        # band 100: nothing may preempt it
    scheduler.wait_for(running(2), what="the second job running")
    urgent = start(150, "urgent-done")
    scheduler.wait_for(lambda: scheduler.job(low_job["id"])["state"] in ("preempting",
                                                                         "pending"),
                       what="the preemption")
    # the urgent job starts where the low one was, once it has checkpointed and stopped
    urgent_job = scheduler.wait_for(
        lambda: [j for j in scheduler.jobs(state="running") if j["priority"] == 150],
        what="the urgent job running")[0]
    assert scheduler.job(urgent_job["id"])["replicas"][0]["host"] == first_host
    low_now = scheduler.job(low_job["id"])
    assert low_now["state"] == "pending" and low_now["requeue_reason"] == "preempted"
    assert low_now["preempted_by"] == urgent_job["id"]
    kinds = [e["kind"] for e in scheduler.events(low_job["id"])]
    assert kinds[:5] == ["submitted", "admitted", "running", "preempted", "requeued"]
    requeued = next(e for e in scheduler.events(low_job["id"]) if e["kind"] == "requeued")
    assert "its launcher stopped the replicas" in requeued["message"]   # not by force
    # the other host frees: the low job runs again there, a restarted attempt
    (tmp_path / "other-done").touch()
    assert other.result()["tasks"] == {"train": "success"}

    def second_admission():
        j = scheduler.job(low_job["id"])
        return j["state"] == "running" and j["attempt"] == 2 and j
    again = scheduler.wait_for(second_admission, what="the low job's second admission")
    live = [r for r in again["replicas"] if r["live"]]
    assert live[0]["host"] != first_host
    (tmp_path / "low-done").touch()
    (tmp_path / "urgent-done").touch()
    assert low.result()["tasks"] == {"train": "success"}
    assert urgent.result()["tasks"] == {"train": "success"}
    out = low.output
    # SIGTERM reached the container, which used its grace to checkpoint
    assert "checkpoint saved at step" in out
    assert "sending SIGTERM to all replicas" in out
    runs = re.findall(r"\[main-0\] AIRFLOW_GPU_ATTEMPT=(\d+)", out)
    assert runs == ["1", "2"]
    assert "AIRFLOW_GPU_RESTARTED=1" in out and "AIRFLOW_GPU_REQUEUE_REASON=preempted" in out
    assert scheduler.job(low_job["id"])["state"] == "succeeded"
    assert len(scheduler.jobs()) == 3           # the same job id, not a new one
