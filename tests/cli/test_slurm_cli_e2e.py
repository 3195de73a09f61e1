"""The Slurm / Grid Engine commands as users run them: `airflow-gpu server` in its own
process, and queue, prio, share, hold, release, update, requeue, drain --reason, resume,
cluster, and job references by name and id prefix, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time

import yaml

from tests.cli.test_cli_e2e import cli, server, wait_state  # noqa: F401 (fixture)


def job_file(tmp_path, name: str, gpus: int, runtime: str = "1h", **more):
    path = tmp_path / f"{name}.yaml"
    roles = [{"name": "w", "replicas": gpus // 8, "gpus": 8}] if gpus > 8 else [
        {"name": "w", "gpus": gpus}]
    path.write_text(yaml.safe_dump({"name": name, "expected_runtime": runtime,
                                    "roles": roles, **more}))
    return str(path)


def until(check, what: str, timeout: float = 15):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return got


def test_slurm_habits_from_the_command_line(server, tmp_path):  # noqa: F811
    token = cli("token", "create", "--team", "vision", "--db", server["db"]).stdout.strip()
    admin = cli("token", "create", "--team", "ops", "--admin", "--db",
                server["db"]).stdout.strip()
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": token}
    as_admin = {**env, "AIRFLOW_GPU_TOKEN": admin}

    def run(*args, who=env, rc=0):
        out = cli(*args, env=who)
        assert out.returncode == rc, (args, out.stdout, out.stderr)
        return out

    big = run("submit", job_file(tmp_path, "big", 16, "2h")).stdout.strip()
    assert wait_state(env, "big", "admitted")["id"] == big          # status by name
    small = run("submit", job_file(tmp_path, "small", 1, "10m")).stdout.strip()
    urgent = run("submit", job_file(tmp_path, "urgent", 8, priority=5)).stdout.strip()
    until(lambda: json.loads(run("explain", urgent[:6], "--json").stdout)["code"],
          "a pass explains the pending job")

    # queue: the live job, then pending ones in the scheduler's order
    queue = json.loads(run("queue", "--json").stdout)
    assert [j["name"] for j in queue] == ["big", "urgent", "small"]
    assert [j["rank"] for j in queue] == [None, 1, 2]
    table = run("queue").stdout
    assert "Resources" in table and f"big ({big[:8]})" in table and "dgx-1,dgx-2" in table
    assert "pending" in table and "admitted" in table
    # prio and share
    prio = json.loads(run("prio", "--json").stdout)
    assert [(j["name"], j["band"]) for j in prio["jobs"]] == [("urgent", 5), ("small", 0)]
    table = run("prio").stdout
    assert "urgent" in table and "fair share" in table
    shares = {t["name"]: t for t in json.loads(run("share", "--json").stdout)}
    assert shares["vision"]["held_gpus"] == 16 and shares["vision"]["pending_jobs"] == 2
    assert "vision" in run("share").stdout

    # explain names blockers; a too-short or ambiguous reference is one line
    why = json.loads(run("explain", "urgent", "--json").stdout)
    assert why["blockers"][0]["name"] == "big" and f"big ({big[:8]})" in why["reason"]
    out = run("status", big[:3], rc=1)
    assert "404" in out.stderr and "at least 4 characters" in out.stderr
    twin = run("submit", job_file(tmp_path, "small", 1, "10m")).stdout.strip()
    out = run("cancel", "small", rc=1)
    assert "409" in out.stderr and small in out.stderr and twin in out.stderr
    run("cancel", twin[:8])

    # hold / release, update
    assert "JobHeldUser" in run("hold", "small").stdout
    out = run("release", "small", who=as_admin)
    assert "pending" in out.stdout
    run("hold", "small", who=as_admin)
    assert "only an admin" in run("release", "small", rc=1).stderr
    run("release", "small", who=as_admin)
    job = json.loads(run("update", "small", "--priority", "7", "--json").stdout)
    assert job["priority"] == 7
    assert [j["name"] for j in json.loads(run("prio", "--json").stdout)["jobs"]] == [
        "small", "urgent"]
    out = run("update", "small", "--time-limit", "nonsense", rc=2)
    assert "422" in out.stderr and "time_limit" in out.stderr

    # drain with a reason: shown by cluster; resume clears it
    assert "403" in run("drain", "dgx-1", "--reason", "bad fan", rc=1).stderr
    out = run("drain", "dgx-1", "--reason", "bad fan", who=as_admin)
    assert "drained (reason: bad fan)" in out.stdout
    cluster = json.loads(run("cluster", "--json").stdout)
    assert cluster["hosts"][0]["drain_reason"] == "bad fan"
    assert cluster["hosts"][0]["free_gpus"] == 0 and cluster["cpus_total"] > 0
    table = run("cluster").stdout
    assert "bad fan" in table and "dgx-2" in table
    run("resume", "dgx-1", who=as_admin)
    assert json.loads(run("cluster", "--json").stdout)["hosts"][0]["drain_reason"] is None

    # requeue the big job: it stops like a preempted one and comes back under its id
    run("cancel", "urgent")
    job = json.loads(run("requeue", "big", "--json").stdout)
    assert job["state"] == "preempting" and job["preempt_reason"].startswith("requeued by")
    # no launcher confirms: the service requeues it by force after the grace (+10 s)
    assert run("queue", "--state", "preempting").returncode == 0
    assert json.loads(run("queue", "--all", "--json").stdout)[-1]["state"] == "cancelled"
