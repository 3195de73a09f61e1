"""A distributed gang as one Airflow task: one container per replica across the admitted
hosts, one consistent TF_CONFIG, and a failing replica takes the whole gang down.

Each simulated host is this machine (2 CPUs, 4 GPUs), so 2 ps + 4 workers x 2 GPUs land on
three hosts: the workers fill two, the parameter servers share the third (same switch)."""

from __future__ import annotations

import json
import re

import docker
import pytest

from airflow_gpu.launch.replica import Replica
from airflow_gpu.launch.wiring import wiring


def tf_configs(output: str) -> dict[str, dict]:
    return {name: json.loads(cfg) for name, cfg in
            re.findall(r"\[((?:ps|worker)-\d)\] TF_CONFIG=(\{.*\})", output)}


@pytest.mark.parametrize("scheduler", [3], indirect=True)
def test_gang_starts_one_container_per_replica_with_one_tf_config(run_dag, scheduler):
    run = run_dag("gpu_gang.py", "gpu_gang")
    assert run.result()["tasks"] == {"train": "success"}, run.output[-3000:]
    configs = tf_configs(run.output)
    assert sorted(configs) == ["ps-0", "ps-1", "worker-0", "worker-1", "worker-2", "worker-3"]
    cluster = configs["ps-0"]["cluster"]
    assert all(c["cluster"] == cluster for c in configs.values())     # one view of the gang
    assert len(cluster["ps"]) == 2 and len(cluster["worker"]) == 4
    addresses = cluster["ps"] + cluster["worker"]
    assert len(set(addresses)) == 6                                  # no port collides
    for name, c in configs.items():
        role, index = name.split("-")
        assert c["task"] == {"type": role, "index": int(index)}
    job = scheduler.job(scheduler.jobs()[0]["id"])
    workers = [r for r in job["replicas"] if r["role"] == "worker"]
    assert len({r["host"] for r in workers}) == 2                     # packed: 2 hosts
    assert sorted(g for r in workers for g in r["gpus"]) == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("scheduler", [3], indirect=True)
def test_one_failing_worker_stops_the_gang_and_fails_the_task(run_dag, scheduler):
    run = run_dag("gpu_gang.py", "gpu_gang", FAIL_WORKER="2", RUN_FOR="300")
    assert run.result()["tasks"] == {"train": "failed"}
    assert "replica worker-2 exited with code 3" in run.output
    assert "[worker-2] loss is NaN, giving up" in run.output        # its last lines
    stopped = re.findall(r"\[((?:ps|worker)-\d)\] exited with code (\d+)", run.output)
    assert dict(stopped)["worker-2"] == "3"
    assert {code for name, code in stopped if name != "worker-2"} == {"143"}
    assert len(stopped) == 6
    job = scheduler.job(scheduler.jobs()[0]["id"])
    assert job["state"] == "failed" and job["exit_code"] == 3
    assert not docker.from_env().containers.list(
        all=True, filters={"label": f"airflow-gpu.job={job['id']}"})


def replica(role, index, host, gpus=(0,)):
    return Replica("j", role, index, 0, host, f"10.0.0.{host[-1]}", None, list(gpus), [0],
                   [0], 1, [])


def test_pytorch_wiring_ranks_and_master():
    rs = [replica("worker", i, h) for i, h in enumerate(["h1", "h1", "h2", "h2"])]
    env = wiring("pytorch", rs, 29500)
    assert [e["RANK"] for e in env] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in env] == ["0", "1", "0", "1"]
    assert {e["MASTER_ADDR"] for e in env} == {"10.0.0.1"}
    assert {e["WORLD_SIZE"] for e in env} == {"4"}
    assert [e["GROUP_RANK"] for e in env] == ["0", "0", "1", "1"]


def test_tf_wiring_gives_replicas_on_one_host_distinct_ports():
    rs = [replica("ps", 0, "h1", ()), replica("worker", 0, "h1"), replica("worker", 1, "h2")]
    cfg = [json.loads(e["TF_CONFIG"]) for e in wiring("tensorflow-ps", rs, 2222)]
    assert cfg[0]["cluster"] == {"ps": ["10.0.0.1:2222"],
                                 "worker": ["10.0.0.1:2223", "10.0.0.2:2222"]}
    assert [c["task"] for c in cfg] == [{"type": "ps", "index": 0},
                                       {"type": "worker", "index": 0},
                                       {"type": "worker", "index": 1}]
