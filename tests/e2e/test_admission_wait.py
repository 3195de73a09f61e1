"""Waiting for admission ends when it should under `airflow dags test`, where the trigger
runs inline and nothing but the trigger itself enforces `admission_timeout`: the task
fails at the timeout with the pending reason, SIGTERM stops the run, and either way the
job is cancelled at the scheduler-core."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import DAGS, Scheduler, airflow_env
from tests.helpers import REPO


@pytest.fixture
def scheduler(tmp_path):
    """A lease long enough that the blocker, which no runner heartbeats, holds its GPUs."""
    s = Scheduler(tmp_path, lease_ttl=600)
    yield s
    s.stop()


def hold_every_gpu(scheduler) -> str:
    """A job that takes every GPU of the two hosts, so the DAG's task stays pending."""
    blocker = scheduler.http.post("/api/v1/jobs", json={"spec": {
        "name": "blocker", "roles": [{"name": "w", "replicas": 2, "gpus": 4, "cpus": 1,
                                      "memory": "64MiB"}]}}).raise_for_status().json()
    scheduler.wait_for(lambda: scheduler.job(blocker["id"])["state"] == "admitted",
                       what="the blocker admitted")
    return blocker["id"]


def dags_test(airflow_home, scheduler, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "airflow", "dags", "test", "gpu_wait",
         "--dagfile-path", str(DAGS / "gpu_wait.py")], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env=airflow_env(airflow_home, AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT=
                        scheduler.connection(), **env))


def waiting_job(scheduler, blocker: str) -> dict:
    return scheduler.wait_for(
        lambda: next((j for j in scheduler.jobs() if j["id"] != blocker
                      and j["state"] == "pending" and (j["pending"] or {}).get("reason")),
                     None),
        timeout=120, what="the task's job pending, with its reason")


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"`airflow dags test` still ran after {timeout}s:\n"
                             f"{out[-4000:]}") from None
    return out


def test_admission_timeout_fails_the_task_and_cancels_the_job(airflow_home, scheduler):
    blocker = hold_every_gpu(scheduler)
    proc = dags_test(airflow_home, scheduler, GPU_WAIT_TIMEOUT="4")
    job = waiting_job(scheduler, blocker)
    waited = time.monotonic()
    out = finish(proc, 90)
    assert time.monotonic() - waited < 60, out[-4000:]
    assert proc.returncode != 0, out[-4000:]
    assert f"GPU job {job['id'][:8]}: not admitted within 4s (admission_timeout)" in out
    reason = job["pending"]["reason"].split(";")[0]           # the stable part of it
    assert f"waiting for: {reason}" in out, out[-4000:]
    assert scheduler.job(job["id"])["state"] == "cancelled"


def test_sigterm_while_waiting_stops_the_run_and_cancels_the_job(airflow_home, scheduler):
    blocker = hold_every_gpu(scheduler)
    proc = dags_test(airflow_home, scheduler)
    job = waiting_job(scheduler, blocker)
    time.sleep(2)                        # in the inline trigger by now (grace 0.2s)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, 30)
    assert proc.returncode != 0, out[-4000:]
    assert f"cancelled GPU job {job['id'][:8]}" in out, out[-4000:]
    assert scheduler.job(job["id"])["state"] == "cancelled"
    assert scheduler.job(blocker)["state"] == "admitted"
