"""The idle-GPU policy crossed with requeue and a job waiting for the same host, through
the real service and its store (SQLite and PostgreSQL), utilization fed by node-agent
reports: the idle job is requeued behind the waiting 16-GPU job, which starts on the
GPUs it freed; the idle job does not loop back onto them; at its `hold_after`-th idle
requeue it is held with a reason its team and an admin see, and its team releases it.
A requeued pending job shows no placement as current: its old grants are history."""

from __future__ import annotations

import io
import json
import time

import httpx
import pytest
from rich.console import Console

from airflow_gpu.cli.commands.status_view import job_table
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from tests.cli.test_cli_e2e import cli, server, wait_state  # noqa: F401 (fixture)
from tests.cli.test_slurm_cli_e2e import job_file
from tests.databases import serve
from tests.helpers import until
from tests.scheduler_core.api.test_api import auth, submit
from tests.scheduler_core.service.test_accounting import report
from tests.scheduler_core.service.test_reclaim_and_requeue import beat, job

# one DGX-2: 16 GPUs on one host
HOSTS = ({"name": "dgx2-1", "model": "dgx-2", "rack": "r1", "switch": "s1"},)
POLICY = {"idle": {"after": 1, "threshold": 5, "action": "requeue", "grace": 1,
                   "hold_after": 2}}


@pytest.fixture
def api(db_url):
    yield from serve(db_url, PolicyConfig.model_validate(POLICY), HOSTS)


def one_role(name: str, gpus: int) -> dict:
    return {"name": name, "roles": [{"name": "w", "gpus": gpus}], "expected_runtime": "1h"}


def admitted(api, name: str, gpus: int) -> dict:
    j = submit(api, "vision", one_role(name, gpus)).json()
    assert api.tick() == [j["id"]]
    return beat(api, job(api, j["id"]))


def idle_until_stopped(api, j: dict) -> dict:
    """Report the job's GPUs at 0 % until the policy stops it; its launcher confirms."""
    (rep,) = [r for r in j["replicas"] if r["live"]]

    def stopping():
        report(api, rep["host"], {g: {"utilization_gpu": 0.0} for g in rep["gpus"]})
        time.sleep(0.2)
        return job(api, j["id"])["state"] == "preempting"

    until(stopping, "the idle policy stops the job", timeout=30)
    r = api.post(f"/api/v1/jobs/{j['id']}/finish", headers=auth(api, "vision"),
                 json={"outcome": "preempted", "attempt": j["attempt"]})
    assert r.status_code == 200, r.text
    return r.json()


def events(api, job_id: str, who: str = "vision") -> list[dict]:
    return api.get(f"/api/v1/jobs/{job_id}/explain", headers=auth(api, who)).json()["events"]


def rendered(j: dict) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(job_table(j))
    return out.getvalue()


def test_idle_job_goes_behind_the_waiting_job_then_is_held_and_released(api):
    idle = admitted(api, "notebook", 8)
    big = submit(api, "vision", one_role("train", 16)).json()
    assert api.tick() == []
    assert job(api, big["id"])["pending"]["code"] == "Resources"

    # 1st idle requeue: back in the queue behind the waiting job, which starts
    got = idle_until_stopped(api, idle)
    assert (got["state"], got["requeue_reason"], got["idle_requeues"]) == (
        "pending", "idle", 1)
    (said,) = [e["message"] for e in events(api, idle["id"]) if e["kind"] == "requeued"]
    assert "behind the other jobs of its band" in said and "held at idle requeue 2" in said
    # no placement now; the admission that ended is history, marked so
    assert got["replicas"] and not any(r["live"] for r in got["replicas"])
    assert {r["admission"] for r in got["replicas"]} == {1}
    text = rendered(got)
    assert "no placement now (pending, requeued: idle)" in text
    assert "Earlier admissions (ended: history, not held now)" in text
    main, history = text.split("Earlier admissions")
    assert "dgx2-1" not in main and "dgx2-1" in history
    # the waiting 16-GPU job starts on the GPUs the idle job freed; the idle job waits
    assert api.tick() == [big["id"]]
    assert api.tick() == []
    assert job(api, idle["id"])["state"] == "pending"
    prio = api.get("/api/v1/priorities", headers=auth(api, "vision")).json()
    assert [(j["name"], j["behind"]) for j in prio["jobs"]] == [("notebook", True)]

    # the waiting job ends: the idle job is admitted again, and idles again
    big = beat(api, job(api, big["id"]))
    r = api.post(f"/api/v1/jobs/{big['id']}/finish", headers=auth(api, "vision"),
                 json={"outcome": "succeeded", "attempt": big["attempt"]})
    assert r.status_code == 200, r.text
    assert api.tick() == [idle["id"]]
    again = beat(api, job(api, idle["id"]))
    assert {r["admission"] for r in again["replicas"] if r["live"]} == {2}
    assert {r["admission"] for r in again["replicas"] if not r["live"]} == {1}
    assert "Earlier admissions" in rendered(again)
    (listed,) = api.get("/api/v1/queue", headers=auth(api, "vision")).json()
    assert {r["admission"] for r in listed["replicas"]} == {2}    # its live grants only

    # 2nd idle requeue (hold_after: 2): held, with a reason its team and an admin see
    got = idle_until_stopped(api, again)
    assert (got["state"], got["idle_requeues"]) == ("pending", 2)
    why = got["pending"]
    assert why["code"] == "JobHeldUser" and why["details"]["hold"] == "idle"
    assert "held by the idle-GPU policy: requeued 2 times" in why["reason"]
    assert f"airflow-gpu release {idle['id'][:8]}" in why["reason"]
    assert api.tick() == []                         # a held job is never started
    for who in ("vision", "admin"):
        explained = api.get(f"/api/v1/jobs/{idle['id']}/explain",
                            headers=auth(api, who)).json()
        assert explained["code"] == "JobHeldUser" and "idle" in explained["reason"]
        queued = api.get("/api/v1/queue", headers=auth(api, who)).json()
        assert [(q["name"], q["pending"]["code"]) for q in queued] == [
            ("notebook", "JobHeldUser")]
    said = [(e["kind"], e["message"]) for e in events(api, idle["id"])][-2:]
    assert said[0][0] == "requeued" and "held: idle requeue 2 of 2" in said[0][1]
    assert said[1] == ("held", why["reason"])
    assert api.tick() == []

    # its team releases it: it is scheduled again
    r = api.post(f"/api/v1/jobs/{idle['id']}/release", headers=auth(api, "vision"))
    assert r.status_code == 200, r.text
    assert r.json()["pending"]["code"] is None
    assert api.tick() == [idle["id"]]


def test_status_of_a_requeued_pending_job_shows_its_old_placement_as_history(
        server, tmp_path):  # noqa: F811
    """`airflow-gpu status` as users run it, against `airflow-gpu server`."""
    token = cli("token", "create", "--team", "vision", "--db", server["db"]).stdout.strip()
    admin = cli("token", "create", "--team", "ops", "--admin", "--db",
                server["db"]).stdout.strip()
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": token, "COLUMNS": "200"}

    def run(*args, who=env):
        out = cli(*args, env=who)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    job_id = run("submit", job_file(tmp_path, "train", 8)).strip()
    first = wait_state(env, job_id, "admitted")
    (host,) = {r["host"] for r in first["replicas"]}
    # no host takes it back at once: both drained while its launcher stops it
    for h in ("dgx-1", "dgx-2"):
        run("drain", h, "--reason", "maintenance", who={**env, "AIRFLOW_GPU_TOKEN": admin})
    run("requeue", job_id)
    r = httpx.post(f"{server['url']}/api/v1/jobs/{job_id}/finish",
                   headers={"Authorization": f"Bearer {token}"},
                   json={"outcome": "preempted", "attempt": first["attempt"]})
    assert r.status_code == 200, r.text
    text = run("status", job_id)
    assert "pending" in text and "no placement now (pending, requeued: requeued)" in text
    now, history = text.split("Earlier admissions (ended: history, not held now)")
    cell = f" {host} │"                        # the host as a table cell
    assert cell not in now and cell in history
    got = json.loads(run("status", job_id, "--json"))
    assert [(r["live"], r["admission"]) for r in got["replicas"]] == [(False, 1)]
    # admitted again: its placement now, and the first admission still as history
    run("resume", host, who={**env, "AIRFLOW_GPU_TOKEN": admin})
    again = wait_state(env, job_id, "admitted")
    assert sorted((r["live"], r["admission"]) for r in again["replicas"]) == [
        (False, 1), (True, 2)]
    now, history = run("status", job_id).split("Earlier admissions")
    assert cell in now and cell in history
