"""Borrowing, reclaim and priority preemption through the real service and its store
(SQLite and PostgreSQL): the victim is told to stop (preempting), keeps its GPUs until its
launcher says it stopped (or its grace runs out), is requeued under the same id, and the
preemptor starts on what it freed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import serve
from tests.scheduler_core.api.test_api import auth, spec, submit

POLICY = {"teams": {"vision": {"quota_gpus": 8, "borrow_gpus": None},
                    "nlp": {"quota_gpus": 8}},
          "preemption": {"min_run_time": 0, "min_saved_wait": 0,
                         "rules": [{"min_band": 100, "preempts_below": 100}]}}


@pytest.fixture
def api(db_url):
    yield from serve(db_url, PolicyConfig.model_validate(POLICY))


def job(api, job_id: str, team: str = "vision") -> dict:
    return api.get(f"/api/v1/jobs/{job_id}", headers=auth(api, team)).json()


def beat(api, j: dict, team: str = "vision") -> dict:
    r = api.post(f"/api/v1/jobs/{j['id']}/heartbeat", params={"attempt": j["attempt"]},
                 headers=auth(api, team))
    assert r.status_code == 200, r.text
    return r.json()


def _borrowing(api) -> tuple[dict, dict]:
    """vision holds both hosts: v1 on its guarantee, v2 borrowed."""
    v1 = submit(api, "vision", spec("v1", 8)).json()
    api.tick()
    v2 = submit(api, "vision", spec("v2", 8)).json()
    api.tick()
    v1, v2 = beat(api, job(api, v1["id"])), beat(api, job(api, v2["id"]))
    assert (v1["state"], v1["borrowed"], v2["state"], v2["borrowed"]) == (
        "running", False, "running", True)
    return v1, v2


def test_reclaim_stops_the_borrowed_job_and_the_owner_starts_on_its_gpus(api):
    v1, v2 = _borrowing(api)
    teams = {t["name"]: t for t in api.get("/api/v1/teams", headers=auth(api, "nlp")).json()}
    assert (teams["vision"]["borrowed_gpus"], teams["nlp"]["lent_gpus"]) == (8, 8)
    n1 = submit(api, "nlp", spec("n1", 8)).json()
    assert api.tick() == []
    v2 = job(api, v2["id"])
    assert v2["state"] == "preempting" and v2["preempted_by"] == n1["id"]
    assert (v2["preempt_signal"], v2["preempt_grace"]) == ("SIGTERM", 30)
    assert "reclaim" in v2["preempt_reason"] and v2["preemptions"] == 1
    assert job(api, v1["id"])["state"] == "running"
    listed = api.get("/api/v1/jobs", params={"state": "preempting"}, headers=auth(api, "nlp"))
    assert [j["id"] for j in listed.json()] == [v2["id"]], listed.text
    why = job(api, n1["id"], "nlp")["pending"]
    assert why["code"] == "Preempting" and why["details"]["victims"] == [v2["id"]]
    # the victim's launcher keeps its lease while it checkpoints, then says it stopped
    assert beat(api, v2)["state"] == "preempting"
    assert api.tick() == []                     # its GPUs are still held
    r = api.post(f"/api/v1/jobs/{v2['id']}/finish",
                 json={"outcome": "preempted", "attempt": v2["attempt"]},
                 headers=auth(api, "vision"))
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["requeue_reason"]) == ("pending", "preempted")
    assert api.tick() == [n1["id"]]
    n1 = job(api, n1["id"], "nlp")
    old = {x["host"] for x in job(api, v2["id"])["replicas"] if not x["live"]}
    assert {x["host"] for x in n1["replicas"]} == old and not n1["borrowed"]
    kinds = [e["kind"] for e in api.get(f"/api/v1/jobs/{v2['id']}/explain",
                                        headers=auth(api, "vision")).json()["events"]]
    assert kinds == ["submitted", "admitted", "running", "preempted", "requeued"]
    explain = api.get(f"/api/v1/jobs/{v2['id']}/explain", headers=auth(api, "vision")).json()
    assert explain["preempted_by"] == n1["id"] and explain["preemptions"] == 1
    metrics = api.get("/metrics").text
    assert 'airflow_gpu_preemptions_total{reason="reclaim"} 1.0' in metrics
    # the requeued job waits: never by preempting n1 back (n1 is guaranteed work anyway)
    api.tick()
    assert job(api, v2["id"])["state"] == "pending"
    assert job(api, n1["id"], "nlp")["state"] == "admitted"


def test_a_victim_whose_launcher_never_confirms_is_requeued_after_its_grace(api):
    _, v2 = _borrowing(api)
    n1 = submit(api, "nlp", spec("n1", 8)).json()
    api.tick()
    assert job(api, v2["id"])["state"] == "preempting"
    with api.service.sessions.begin() as s:       # its grace and the slack have passed
        s.execute(update(JobRow).where(JobRow.id == v2["id"]).values(
            preempt_deadline_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert api.tick() == [n1["id"]]
    v2 = job(api, v2["id"])
    assert v2["state"] == "pending" and v2["requeue_reason"] == "preempted"
    events = api.get(f"/api/v1/jobs/{v2['id']}/explain", headers=auth(api, "vision")).json()
    assert "did not confirm the stop" in events["events"][-1]["message"]
    # the old launcher's next heartbeat hears that the job is no longer its own
    r = api.post(f"/api/v1/jobs/{v2['id']}/heartbeat", params={"attempt": 1},
                 headers=auth(api, "vision"))
    assert r.status_code == 409 and "is pending" in r.text


def test_an_urgent_job_preempts_by_priority_but_never_another_teams_guarantee(api):
    low = submit(api, "nlp", spec("low", 8)).json()
    api.tick()
    other = submit(api, "vision", spec("other", 8)).json()
    api.tick()
    urgent = submit(api, "vision", {**spec("urgent", 8), "priority": 100}).json()
    api.tick()
    # nlp's job is guaranteed work: priority never takes it; vision's own job goes
    assert job(api, low["id"], "nlp")["state"] == "admitted"
    other = job(api, other["id"])
    assert other["state"] == "preempting" and "priority band 100" in other["preempt_reason"]
    api.post(f"/api/v1/jobs/{other['id']}/finish", json={"outcome": "preempted"},
             headers=auth(api, "vision"))
    assert api.tick() == [urgent["id"]]
