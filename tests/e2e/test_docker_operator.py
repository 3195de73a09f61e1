"""GpuDockerOperator end to end: real Airflow (dag.test), the real scheduler-core, a real
Docker engine. What the container sees must be what the scheduler granted."""

from __future__ import annotations

import re
import signal

import docker
import pytest

from airflow_gpu.launch.docker import DockerLauncher
from airflow_gpu.launch.handle import LaunchError
from airflow_gpu.launch.replica import Replica
from airflow_gpu.scheduler_core.engine.topology import parse_cpulist


def probe_values(output: str) -> dict[str, str]:
    """`key=value` lines the probe container printed into the task log."""
    return dict(re.findall(r"\[main-0\] ([A-Za-z_.]+)=(\S*)", output))


def only_job(scheduler, **params) -> dict:
    jobs = scheduler.jobs(**params)
    assert len(jobs) == 1, jobs
    return scheduler.job(jobs[0]["id"])


def container_running(scheduler) -> tuple[dict, docker.DockerClient, dict]:
    """The running job, the engine, and the label filter of its container, once it runs."""
    job = scheduler.wait_for(lambda: scheduler.jobs(state="running"), what="running")[0]
    engine = docker.from_env()
    label = {"label": f"airflow-gpu.job={job['id']}"}
    scheduler.wait_for(lambda: engine.containers.list(filters=label), what="container")
    return job, engine, label


def test_container_gets_exactly_its_grant(run_dag, scheduler):
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="2", TEST_GPU_MODE="env")
    assert run.result()["tasks"] == {"probe": "success"}
    job = only_job(scheduler)
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    (grant,) = job["replicas"]
    seen = probe_values(run.output)
    assert parse_cpulist(seen["cpuset.cpus"]) == grant["cpus"]
    assert seen["cpuset.mems"] == ",".join(grant["memory_by_numa"])
    assert int(seen["memory.limit"]) == sum(grant["memory_by_numa"].values()) == 256 * 2**20
    assert seen["NVIDIA_VISIBLE_DEVICES"] == ",".join(map(str, grant["gpus"]))
    assert len(grant["gpus"]) == 2
    assert seen["AIRFLOW_GPU_HOST"] == grant["host"]
    assert seen["NCCL_IB_HCA"] == ",".join(grant["nics"]) and grant["nics"]
    # the lease was released: nothing is held any more
    cluster = scheduler.http.get("/api/v1/cluster").json()
    assert cluster["gpus_allocated"] == 0


def test_a_task_that_asks_no_memory_books_some_and_is_limited_to_it(run_dag, scheduler):
    # no memory from the task, its class (validation) or the policy: 1GiB per CPU for a
    # CPU-only replica, booked and the container's limit
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="0", TEST_MEMORY="")
    assert run.result()["tasks"] == {"probe": "success"}, run.output[-3000:]
    (grant,) = only_job(scheduler)["replicas"]
    booked = sum(grant["memory_by_numa"].values())
    assert booked == 1 * 2**30
    assert int(probe_values(run.output)["memory.limit"]) == booked
    # no GPU granted: none visible even where the NVIDIA runtime is the engine's default
    assert probe_values(run.output)["NVIDIA_VISIBLE_DEVICES"] == "void"
    # with a GPU it books 16GiB more, which these 8GiB hosts cannot hold: refused at once
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="1", TEST_MEMORY="")
    assert run.result()["tasks"] == {"probe": "failed"}
    assert "one replica needs 1 CPU and 17GiB" in run.output


def test_device_request_holds_exactly_the_granted_gpus(docker_engine):
    replica = Replica("0f0f0f0f-test", "worker", 3, 0, "host-1", "127.0.0.1", None,
                      [1, 3], [0], [0], 64 * 2**20, [])
    launcher = DockerLauncher(image=docker_engine, command=["true"], network_mode="none")
    container = launcher.create(replica, {})
    try:
        container.reload()
        requests = container.attrs["HostConfig"]["DeviceRequests"]
        assert requests == [{"Driver": "nvidia", "Count": 0, "DeviceIDs": ["1", "3"],
                             "Capabilities": [["gpu"]], "Options": {}}]
        assert container.labels["airflow-gpu.job"] == replica.job_id
    finally:
        container.remove(force=True)
    # No NVIDIA runtime on this machine: starting says so, and what to change
    with pytest.raises(LaunchError, match="no NVIDIA runtime.*NVIDIA Container Toolkit"):
        launcher.start(replica, {})
    assert not docker.from_env().containers.list(all=True, filters={
        "label": f"airflow-gpu.job={replica.job_id}"})


def test_device_request_failure_fails_the_task_and_frees_the_gpus(run_dag, scheduler):
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="1",
                  TEST_GPU_MODE="device-request")
    assert run.result()["tasks"] == {"probe": "failed"}
    assert "could not select device driver" in run.output
    assert "NVIDIA Container Toolkit" in run.output
    job = only_job(scheduler)
    assert job["state"] == "failed"
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0


@pytest.mark.parametrize("scheduler", [1], indirect=True)
def test_second_task_waits_deferred_then_runs_on_freed_gpus(run_dag, scheduler, tmp_path):
    """One host, 4 GPUs: 3 + 2 GPUs cannot run together. The second task defers (no
    worker slot) while the first runs, and starts only after the first released."""
    first = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="3",
                    TEST_MOUNT=f"{tmp_path}:/signal", PROBE_WAIT="/signal/go")
    scheduler.wait_for(lambda: [j for j in scheduler.jobs(state="running")], what="first")
    second = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="2", TEST_GRACE="0")
    waiting = scheduler.wait_for(lambda: [j for j in scheduler.jobs(state="pending")
                                          if j["pending"]["code"]], what="a pending reason")
    assert waiting[0]["pending"]["code"] == "Resources"
    (tmp_path / "go").touch()                       # now the first task may end
    assert first.result()["tasks"] == {"probe": "success"}, first.output[-4000:]
    assert second.result()["tasks"] == {"probe": "success"}, second.output[-4000:]
    assert "waiting for GPUs without a worker slot (deferred)" in second.output
    a, b = sorted((scheduler.job(j["id"]) for j in scheduler.jobs()),
                  key=lambda j: j["submitted_at"])
    assert b["admitted_at"] >= a["finished_at"]      # never two jobs on one GPU at once
    assert set(a["replicas"][0]["gpus"]) & set(b["replicas"][0]["gpus"])  # it had to wait


def test_a_container_past_its_time_limit_is_stopped_and_the_task_fails_naming_it(
        run_dag, scheduler):
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="1", PROBE_SLEEP="300",
                  TEST_TIME_LIMIT="4s")
    assert run.result()["tasks"] == {"probe": "failed"}
    assert "the job reached its time limit of 4s (time_limit" in run.output
    assert "SIGKILL after 30s" in run.output          # the policy's grace, unused here:
    assert re.search(r"stopped with SIGTERM; main-0 exited by itself after \d+\.\d s with "
                     r"code 143", run.output), run.output[-4000:]
    job = only_job(scheduler)
    assert (job["state"], job["time_limit_s"]) == ("timeout", 4)
    assert not docker.from_env().containers.list(
        all=True, filters={"label": f"airflow-gpu.job={job['id']}"})
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0


def test_killed_task_removes_its_container_and_frees_the_gpus(run_dag, scheduler):
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="2", PROBE_SLEEP="300")
    job, engine, label = container_running(scheduler)
    run.proc.send_signal(signal.SIGTERM)            # what Airflow does to a killed task
    run.proc.wait(timeout=60)
    assert not engine.containers.list(all=True, filters=label)
    assert scheduler.job(job["id"])["state"] == "cancelled"
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0


def test_dead_worker_is_released_when_its_lease_expires(run_dag, scheduler):
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="2", PROBE_SLEEP="300")
    job, engine, label = container_running(scheduler)
    run.proc.send_signal(signal.SIGKILL)            # the worker dies: no on_kill, no finish
    run.proc.wait(timeout=30)
    lost = scheduler.wait_for(lambda: scheduler.job(job["id"])["state"] == "lost", 30,
                              "the lease to expire")
    assert lost
    assert any(e["kind"] == "lost" for e in scheduler.events(job["id"]))
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0
    # its container outlived it; the next launch removes it before using the GPUs
    assert engine.containers.list(filters=label)
    again = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="2")
    assert again.result()["tasks"] == {"probe": "success"}
    assert not engine.containers.list(all=True, filters=label)
    assert "the job is no longer running" in again.output


@pytest.mark.parametrize("scheduler", [1], indirect=True)
def test_requeued_job_stops_its_container_and_runs_again(run_dag, scheduler, tmp_path):
    """A GPU of a running pytorch job fails: the class requeues the whole job; the task
    stops its container, waits deferred again and runs on healthy GPUs, same job id."""
    run = run_dag("gpu_docker.py", "gpu_docker", TEST_GPUS="2", TEST_JOB_CLASS="pytorch",
                  TEST_MOUNT=f"{tmp_path}:/signal", PROBE_WAIT="/signal/go")
    job, _, _ = container_running(scheduler)
    first = scheduler.job(job["id"])["replicas"][0]
    bad = first["gpus"][0]
    scheduler.http.post(f"/api/v1/hosts/{first['host']}/report", json={"gpus": [
        {"index": bad, "healthy": False, "reason": "XID 79: fallen off the bus"}]}
    ).raise_for_status()
    scheduler.wait_for(lambda: any(e["kind"] == "requeued"
                                   for e in scheduler.events(job["id"])), what="requeue")

    def running_again():
        j = scheduler.job(job["id"])
        live = [r for r in j["replicas"] if r["live"]]
        return j["state"] == "running" and live and live[0]
    second = scheduler.wait_for(running_again, what="the second admission")
    assert bad not in second["gpus"]
    (tmp_path / "go").touch()
    assert run.result()["tasks"] == {"probe": "success"}
    assert "the scheduler requeued the job" in run.output
    assert scheduler.job(job["id"])["state"] == "succeeded"
    assert len(scheduler.jobs()) == 1                      # the same job, not a new one
