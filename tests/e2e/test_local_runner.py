"""The local-process runner: CPU affinity, cgroup (cpuset, NUMA memory nodes, memory
limit) and CUDA_VISIBLE_DEVICES of the process match the placement, read back from /proc
and the cgroup files; the cgroup is gone afterwards."""

from __future__ import annotations

import json
import re
from pathlib import Path

from airflow_gpu.scheduler_core.engine.topology import parse_cpulist


def grant_of(scheduler, task: str) -> dict:
    (job,) = scheduler.jobs(name=f"gpu_local.{task}")
    job = scheduler.job(job["id"])
    assert job["state"] == "succeeded"
    return job["replicas"][0]


def check(found: dict, grant: dict) -> None:
    assert parse_cpulist(found["affinity"]) == grant["cpus"]
    assert parse_cpulist(found["cgroup"]["cpus"]) == grant["cpus"]
    assert found["cgroup"]["mems"] == ",".join(grant["memory_by_numa"])
    assert int(found["cgroup"]["memory"]) == sum(grant["memory_by_numa"].values())
    assert found["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, grant["gpus"]))
    assert found["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    for path in found["cgroup_paths"].values():       # removed when the process ended
        assert "airflow-gpu" in path and not Path(path).exists()


def test_local_processes_get_exactly_their_grant(run_dag, scheduler):
    run = run_dag("gpu_local.py", "gpu_local")
    result = run.result()
    assert result["tasks"] == {"bash_probe": "success", "python_probe": "success"}, \
        run.output[-4000:]
    bash = json.loads(re.search(r"\[main-0\] PROBE (\{.*\})", run.output).group(1))
    check(bash, grant_of(scheduler, "bash_probe"))
    assert len(bash["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    # @task.gpu: the callable ran in an isolated child; its return value is the XCom
    python = json.loads(re.search(r"\[main-0\] PROBE-PY (\{.*\})", run.output).group(1))
    check(python, grant_of(scheduler, "python_probe"))
    assert len(python["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    assert result["returned"]["python_probe"] == {"affinity": python["affinity"]}
    assert result["returned"]["bash_probe"]["replicas"][0]["gpus"] == grant_of(
        scheduler, "bash_probe")["gpus"]


def test_a_local_task_past_its_time_limit_gets_sigterm_and_fails_naming_it(run_dag,
                                                                           scheduler):
    run = run_dag("gpu_limit_local.py", "gpu_limit_local")
    assert run.result()["tasks"] == {"long": "failed"}, run.output[-4000:]
    assert "[main-0] working" in run.output
    assert "the job reached its time limit of 3s (time_limit" in run.output
    # what it wrote after SIGTERM reaches the task log; the failure says how it ended
    assert "[main-0] checkpoint saved" in run.output
    assert re.search(r"stopped with SIGTERM; main-0 exited by itself after 1\.\d s with "
                     r"code 143", run.output), run.output[-4000:]
    (job,) = scheduler.jobs(name="gpu_limit_local.long")
    job = scheduler.job(job["id"])
    assert (job["state"], job["time_limit_s"]) == ("timeout", 3)
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0
