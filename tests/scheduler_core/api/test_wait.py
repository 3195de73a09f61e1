"""Long-poll waits for jobs (GET /api/v1/jobs/{id}/wait, POST /api/v1/jobs/wait) through
the real app and store, SQLite and PostgreSQL: a wait returns when a pass admits the job
(run from another thread while the request waits), at its timeout with every job as it
stands, at once for a job already past the state; bad input is a 422 naming the field."""

from __future__ import annotations

import threading

from tests.scheduler_core.api.test_api import auth, spec, submit


def test_a_wait_returns_when_a_pass_admits_the_job(api):
    fill = submit(api, "vision", spec("fill", 16)).json()["id"]
    api.tick()
    waiting = submit(api, "nlp", spec("next", 8)).json()["id"]
    api.tick()
    r = api.get(f"/api/v1/jobs/{waiting}/wait", params={"timeout": 0},
                headers=auth(api, "nlp"))
    assert r.status_code == 200 and r.json()["state"] == "pending"
    assert r.json()["pending"]["code"] == "Resources"

    def free_then_pass():
        api.post(f"/api/v1/jobs/{fill}/finish", json={"outcome": "succeeded"},
                 headers=auth(api, "vision"))
        api.tick()
    timer = threading.Timer(0.5, free_then_pass)
    timer.start()
    r = api.get(f"/api/v1/jobs/{waiting}/wait", params={"timeout": 30},
                headers=auth(api, "nlp"))
    timer.join()
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["state"] == "admitted" and [g["host"] for g in job["replicas"]]
    # already past the state asked about: at once, as it is
    r = api.get(f"/api/v1/jobs/{waiting}/wait", params={"state": "pending", "timeout": 30},
                headers=auth(api, "nlp"))
    assert r.json()["state"] == "admitted"


def test_a_bulk_wait_gives_the_changed_jobs_or_all_at_its_timeout(api):
    ids = [submit(api, "vision", spec(f"j{i}", 8)).json()["id"] for i in range(3)]
    body = {"ids": ids, "state": "pending", "timeout": 0}
    r = api.post("/api/v1/jobs/wait", json=body, headers=auth(api, "vision"))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["timed_out"] and sorted(j["id"] for j in out["jobs"]) == sorted(ids)
    assert {j["state"] for j in out["jobs"]} == {"pending"}

    threading.Timer(0.3, api.tick).start()        # two of the three fit
    out = api.post("/api/v1/jobs/wait", json={**body, "timeout": 30},
                   headers=auth(api, "vision")).json()
    assert not out["timed_out"] and len(out["jobs"]) == 2
    assert {j["state"] for j in out["jobs"]} == {"admitted"}
    assert all(j["replicas"] for j in out["jobs"])

    out = api.post("/api/v1/jobs/wait", json={**body, "ids": [ids[2], "no-such-job"]},
                   headers=auth(api, "vision")).json()
    assert out["missing"] == ["no-such-job"] and not out["timed_out"]


def test_bad_waits_are_422_naming_the_field(api):
    h = auth(api, "vision")
    job = submit(api, "vision", spec("j", 8)).json()["id"]
    for params, field in (({"timeout": 61}, "timeout"), ({"timeout": -1}, "timeout"),
                          ({"state": "asleep"}, "state")):
        r = api.get(f"/api/v1/jobs/{job}/wait", params=params, headers=h)
        assert r.status_code == 422 and field in r.text, (params, r.text)
    for body, field in (({"ids": []}, "ids"), ({"ids": ["a"] * 1001}, "ids"),
                        ({"ids": ["a"], "timeout": 1e9}, "timeout"),
                        ({"ids": ["a"], "state": "x"}, "state")):
        r = api.post("/api/v1/jobs/wait", json=body, headers=h)
        assert r.status_code == 422 and field in r.text, (body, r.text)
    assert api.get("/api/v1/jobs/nope/wait", headers=h).status_code == 404
    assert api.post("/api/v1/jobs/wait", json={"ids": ["a"]}).status_code == 401
