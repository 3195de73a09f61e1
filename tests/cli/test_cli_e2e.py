"""The service as users run it: `airflow-gpu server` in its own process on loopback, and
the client commands against it (their `main()`, tests/clirun.py), on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.clirun import cli
from tests.servers import Server

CLUSTER = {"cluster": "e2e", "hosts": [
    {"name": "dgx-[1-2]", "model": "dgx-a100", "rack": "r1", "switch": "s1"}]}


@pytest.fixture
def server(db_url, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    srv = Server(db_url, cluster, log=tmp_path / "server.log", interval=0.2)
    yield {"url": srv.url, "db": db_url}
    srv.stop()


def wait_state(env: dict, job_id: str, state: str) -> dict:
    deadline = time.monotonic() + 15
    while True:
        job = json.loads(cli("status", job_id, "--json", env=env).stdout)
        if job["state"] == state or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def test_cli_against_a_running_server(server, tmp_path):
    out = cli("token", "create", "--team", "vision", "--db", server["db"])
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    admin = cli("token", "create", "--team", "ops", "--admin", "--db", server["db"]).stdout.strip()
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": token}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"name": "train", "expected_runtime": "2h",
                                        "roles": [{"name": "w", "replicas": 2, "gpus": 8}]}))
    out = cli("submit", str(job_file), "--json", "--key", "k1", env=env)
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)["id"]
    assert cli("submit", str(job_file), "--key", "k1", env=env).stdout.strip() == first
    job = wait_state(env, first, "admitted")
    assert job["state"] == "admitted"
    assert sorted(r["host"] for r in job["replicas"]) == ["dgx-1", "dgx-2"]

    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"name": "eval", "roles": [{"name": "w", "gpus": 1}]}))
    second = cli("submit", str(small), env=env).stdout.strip()
    deadline = time.monotonic() + 15
    while (why := json.loads(cli("explain", second, "--json", env=env).stdout))["code"] \
            is None and time.monotonic() < deadline:     # until a pass has explained it
        time.sleep(0.1)
    queue = json.loads(cli("queue", "--json", env=env).stdout)
    assert {j["id"]: j["state"] for j in queue} == {first: "admitted", second: "pending"}
    # 2h on two hosts under one switch: slowdown 1.1
    assert why["code"] == "Resources" and 7000 * 1.1 < why["eta_seconds"] <= 7200 * 1.1
    table = cli("queue", env=env).stdout
    assert "Resources" in table and "pending" in table
    slowdown = cli("slowdown", env=env)
    assert slowdown.returncode == 0 and "(policy)" in slowdown.stdout
    assert "1.1" in slowdown.stdout and "one switch" in slowdown.stdout
    assert "Estimate factors" in slowdown.stdout and "correct_estimates: up" in slowdown.stdout
    assert json.loads(cli("slowdown", "--json", env=env).stdout)["default"] == [1.0, 1.1, 1.3]

    out = cli("drain", "dgx-1", env=env)
    assert out.returncode == 1 and "403" in out.stderr
    assert "drained" in cli("drain", "dgx-1", env={**env, "AIRFLOW_GPU_TOKEN": admin}).stdout
    assert cli("cancel", first, "--json", env=env).returncode == 0
    job = wait_state(env, second, "admitted")
    assert job["replicas"][0]["host"] == "dgx-2"       # dgx-1 is drained
    out = cli("team-set", "vision", "--quota-gpus", "4", "--borrow-gpus", "2",
              env={**env, "AIRFLOW_GPU_TOKEN": admin})
    assert out.returncode == 0 and "vision" in out.stdout, out.stderr
    teams = {t["name"]: t for t in json.loads(cli("teams", "--json", env=env).stdout)}
    assert teams["vision"]["quota_gpus"] == 4 and teams["vision"]["held_gpus"] == 1
    assert teams["vision"]["borrow_gpus"] == 2
    cluster = json.loads(cli("cluster", "--json", env=env).stdout)
    assert cluster["gpus_allocated"] == 1
    assert [h["drained"] for h in cluster["hosts"]] == [True, False]
    assert "dgx-2" in cli("cluster", env=env).stdout


def test_client_errors_are_clear(server):
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": "wrong"}
    out = cli("queue", env=env)
    assert out.returncode == 1 and "401: unknown token" in out.stderr
    out = cli("queue", env={"AIRFLOW_GPU_URL": "http://127.0.0.1:9", "AIRFLOW_GPU_TOKEN": "x"})
    assert out.returncode == 2 and "cannot reach the scheduler at http://127.0.0.1:9" in out.stderr
