"""`POST /api/v1/jobs/heartbeats` (service/beats.py) through the real app on SQLite and
PostgreSQL: many jobs' heartbeats in one request, each job answered as its own heartbeat
would be: a running job's lease extended (its revision kept), an admitted job's start
confirmed, and a job that may not be beaten refused with a single heartbeat's status and
words (another team's 403, an unknown 404, an ended or re-admitted one 409), the others
beaten all the same."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from airflow_gpu.scheduler_core.store.models import EventRow, JobRow


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submit(api, team: str = "vision", gpus: int = 1) -> str:
    r = api.post("/api/v1/jobs", headers=auth(api, team), json={"spec": {
        "name": "train", "roles": [{"name": "w", "gpus": gpus}], "expected_runtime": "1h"}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def row(api, job_id: str) -> JobRow:
    with api.service.sessions() as s:
        return s.scalars(select(JobRow).where(JobRow.id == job_id)).one()


def beats(api, who: str, jobs: list) -> dict:
    r = api.post("/api/v1/jobs/heartbeats", headers=auth(api, who), json={"jobs": jobs})
    assert r.status_code == 200, r.text
    return r.json()


def test_many_jobs_beaten_at_once_each_as_its_own_heartbeat(api):
    running, first, ended, readmitted = (submit(api) for _ in range(4))
    theirs = submit(api, "nlp")
    assert set(api.tick()) == {running, first, ended, readmitted, theirs}
    for job_id in (running, ended, readmitted):
        assert api.post(f"/api/v1/jobs/{job_id}/heartbeat",
                        headers=auth(api, "vision")).json()["state"] == "running"
    api.post(f"/api/v1/jobs/{ended}/finish", headers=auth(api, "vision"),
             json={"outcome": "succeeded"})
    before = row(api, running)
    unknown = str(uuid.uuid4())

    out = beats(api, "vision", [
        {"id": running, "attempt": 1}, {"id": first}, {"id": ended}, {"id": theirs},
        {"id": unknown}, {"id": readmitted, "attempt": 7}])

    got = {j["id"]: j for j in out["jobs"]}
    assert set(got) == {running, first}
    assert got[first]["state"] == "running"          # its first beat confirmed the start
    after = row(api, running)
    assert after.lease_expires_at > before.lease_expires_at
    assert after.rev == before.rev           # a lease extension only: the leader reads nothing
    assert row(api, first).started_at is not None
    with api.service.sessions() as s:
        said = s.scalars(select(EventRow.message).where(
            EventRow.job_id == first, EventRow.kind == "running")).all()
    assert said == ["the launcher confirmed the start"]
    refused = {r["id"]: r for r in out["refused"]}
    assert {k: refused[k]["status"] for k in refused} == {
        ended: 409, theirs: 403, unknown: 404, readmitted: 409}
    assert "is succeeded" in refused[ended]["detail"]
    assert "belongs to team 'nlp'" in refused[theirs]["detail"]
    assert "admitted again" in refused[readmitted]["detail"]      # the launcher's admission 7
    single = api.post(f"/api/v1/jobs/{theirs}/heartbeat", headers=auth(api, "vision"))
    assert single.status_code == refused[theirs]["status"]
    assert row(api, theirs).state == "admitted"      # refused: not started by another team


def test_a_preempted_job_hears_its_signal_in_the_batch_answer(api):
    job_id = submit(api)
    assert api.tick() == [job_id]
    assert beats(api, "vision", [{"id": job_id}])["jobs"][0]["state"] == "running"
    with api.service.sessions.begin() as s:       # as a preemption leaves it
        j = s.get(JobRow, job_id)
        j.state, j.preempt_signal, j.preempt_grace = "preempting", "SIGUSR1", 30
    out = beats(api, "vision", [{"id": job_id, "attempt": 1}])
    assert out["jobs"][0]["state"] == "preempting"
    assert (out["jobs"][0]["preempt_signal"], out["jobs"][0]["preempt_grace"]) == (
        "SIGUSR1", 30)


def test_a_bad_batch_is_refused_whole_naming_the_field(api):
    r = api.post("/api/v1/jobs/heartbeats", headers=auth(api, "vision"),
                 json={"jobs": [{"id": "abc"}]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "jobs", 0, "id"]
    r = api.post("/api/v1/jobs/heartbeats", headers=auth(api, "vision"),
                 json={"jobs": [{"id": str(uuid.uuid4())}] * 1001})
    assert r.status_code == 422
    assert "1000" in r.text
    assert api.post("/api/v1/jobs/heartbeats", json={"jobs": []}).status_code == 401
