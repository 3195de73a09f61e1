"""MIG x quota x accounting, as users run it: `airflow-gpu server` in its own process on
a cluster with MIG GPUs and a policy file with a team quota; a team submits MIG jobs
until the quota stops it (each device charged compute slices / 7 of a GPU), `share`
shows what it holds, `cluster` who holds which device, and `acct` charges the jobs
GPU-hours by share and MIG device-hours."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import yaml

from tests.cli.test_cli_e2e import cli
from tests.servers import Server

# GPUs 0-1 of dgx-m: 3g.20gb + 2g.10gb + 2g.10gb each; GPUs 2-7 whole
CLUSTER = {"cluster": "mig-e2e", "hosts": [
    {"name": "dgx-m", "model": "dgx-a100", "rack": "r1", "switch": "s1",
     "mig": [{"gpus": [0, 1], "layout": ["3g.20gb", "2g.10gb", "2g.10gb"]}]}]}


@pytest.fixture
def stack(tmp_path):
    """The server on SQLite with vision's quota of one GPU, and the tokens' environments."""
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(
        {"teams": {"vision": {"quota_gpus": 1}}}))
    db = f"sqlite:///{tmp_path / 'gpu.db'}"
    srv = Server(db, tmp_path / "cluster.yaml", log=tmp_path / "server.log", interval=0.2,
                 lease_ttl=3600,
                 args=("--policy-file", str(tmp_path / "policy.yaml")))
    token = cli("token", "create", "--team", "vision", "--db", db).stdout.strip()
    yield {"AIRFLOW_GPU_URL": srv.url, "AIRFLOW_GPU_TOKEN": token}
    srv.stop()


def run(env, *args) -> str:
    out = cli(*args, env=env)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def status(env, name) -> dict:
    return json.loads(run(env, "status", name, "--json"))


def until(check, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return got


def test_a_team_quota_stops_mig_jobs_and_accounting_charges_them(stack, tmp_path):
    env = stack
    spec = {"team": "vision", "expected_runtime": "1h",
            "roles": [{"name": "eval", "cpus": 2, "memory": "4GiB",
                       "gpu": {"mig": "3g.20gb"}}]}
    ids = []
    for name in ("val-1", "val-2", "val-3"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, **spec}))
        ids.append(run(env, "submit", str(path)).strip())
    until(lambda: status(env, "val-3")["pending"]["code"] == "Quota",
          "the third job waits for the quota")
    for name in ("val-1", "val-2"):
        assert status(env, name)["state"] == "admitted"
    # 2 x 3/7 held: a third 3g device would be 9/7 GPUs against a quota of 1
    reason = status(env, "val-3")["pending"]["reason"]
    assert "holds 0.8571 GPUs of its quota_gpus 1; this job needs 0.4286 more" in reason

    (vision,) = [t for t in json.loads(run(env, "share", "--json")) if t["name"] == "vision"]
    assert vision["held_gpus"] == pytest.approx(6 / 7, abs=1e-4)
    (vision,) = json.loads(run(env, "teams", "--json"))        # GET /api/v1/teams
    assert (vision["held_gpus"], vision["quota_gpus"]) == (0.8571, 1)

    # cluster: who holds which device, free slices, no held MIG GPU shown free
    view = json.loads(run(env, "cluster", "--json"))
    (host,) = view["hosts"]
    holders = {m["job"] for g in host["gpus"] for m in g.get("mig", ()) if m["job"]}
    assert holders == set(ids[:2])
    assert host["gpus_allocated"] == 2 and host["free_gpus"] == 6
    assert (host["mig_devices"], host["mig_devices_held"]) == (6, 2)
    assert [g["mig_free_slices"] for g in host["gpus"][:2]] == [4, 4]
    assert view["mig_gpus_held"] == pytest.approx(6 / 7, abs=1e-4)
    table = cli("cluster", env={**env, "COLUMNS": "250"}).stdout
    assert "MIG devices: 2 of 6 held (0.8571 GPUs by share)" in table
    assert "MM" not in table and "mm######" not in table       # GPUs 0-1 in part: m
    assert "mm......" in table and "2/8" in table
    assert f"GPU 0: 3g.20gb {ids[0][:8]}, 2x 2g.10gb free (4/7 free)" in table
    assert f"{ids[1][:8]} (1x 3g.20gb)" in table
    metrics = httpx.get(f"{env['AIRFLOW_GPU_URL']}/metrics").text       # Prometheus too
    assert 'airflow_gpu_gpus_allocated{host="dgx-m"} 2.0' in metrics
    assert 'airflow_gpu_team_gpus_held{team="vision"} 0.8571' in metrics

    # accounting: GPU-hours = the grant's seconds x 3/7, MIG device-hours = seconds x 1
    time.sleep(1.0)
    rows = {r["name"]: r for r in json.loads(run(env, "acct", "--json"))["rows"]}
    for name in ("val-1", "val-2"):
        r = rows[name]
        assert (r["gpus"], r["mig_devices"]) == (pytest.approx(3 / 7, abs=1e-4), 1)
        assert r["mig_device_hours"] > 0
        assert r["gpu_hours"] == pytest.approx(r["mig_device_hours"] * 3 / 7, abs=2e-4)
    team = json.loads(run(env, "acct", "--by", "team", "--json"))["rows"][0]
    # read later than the rows, each of them rounded to 4 places (up to half a unit each)
    rounding = 0.5e-4 * (len(rows) + 1)
    assert team["mig_device_hours"] >= sum(rows[n]["mig_device_hours"] for n in rows) - rounding
    assert team["gpu_hours"] == pytest.approx(team["mig_device_hours"] * 3 / 7, abs=2e-4)
    table = cli("acct", env={**env, "COLUMNS": "250"}).stdout
    assert "MIG-h" in table and "0.4286 (1 MIG)" in table
    job = cli("acct", "--job", "val-1", env={**env, "COLUMNS": "250"}).stdout
    assert "GPU 0 MIG 3g.20gb #0" in job               # the replica line names its device

    # once one ends, the quota lets the third start
    run(env, "cancel", "val-1")
    until(lambda: status(env, "val-3")["state"] == "admitted", "val-3 starts")
