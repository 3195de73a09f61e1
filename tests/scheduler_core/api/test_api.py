"""The API through FastAPI's test client (the real app, its real store) on SQLite and
PostgreSQL: the job lifecycle, idempotency, auth, validation, leases, explain, metrics."""

from __future__ import annotations

import pytest


def spec(name: str, gpus: int, team: str | None = None, runtime: str = "1h") -> dict:
    roles = [{"name": "w", "replicas": gpus // 8, "gpus": 8}] if gpus > 8 else [
        {"name": "w", "gpus": gpus}]
    out = {"name": name, "roles": roles, "expected_runtime": runtime}
    if team:
        out["team"] = team
    return out


def auth(api, team: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[team]}"}


def submit(api, team: str, body: dict, key: str | None = None):
    return api.post("/api/v1/jobs", json={"spec": body, "idempotency_key": key},
                    headers=auth(api, team))


def test_job_lifecycle(api):
    r = submit(api, "vision", spec("train", 8))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "pending" and job["team"] == "vision"
    assert api.tick() == [job["id"]]
    got = api.get(f"/api/v1/jobs/{job['id']}", headers=auth(api, "nlp")).json()
    assert got["state"] == "admitted"
    (replica,) = got["replicas"]
    assert len(replica["gpus"]) == 8 and replica["host"] in ("dgx-1", "dgx-2")
    r = api.post(f"/api/v1/jobs/{job['id']}/heartbeat", headers=auth(api, "vision"))
    assert r.json()["state"] == "running" and r.json()["started_at"]
    r = api.post(f"/api/v1/jobs/{job['id']}/finish", json={"outcome": "succeeded",
                 "exit_code": 0}, headers=auth(api, "vision"))
    assert r.json()["state"] == "succeeded" and r.json()["exit_code"] == 0
    cluster = api.get("/api/v1/cluster", headers=auth(api, "nlp")).json()
    assert cluster["gpus_allocated"] == 0 and cluster["gpus_total"] == 16
    events = api.get(f"/api/v1/jobs/{job['id']}/explain", headers=auth(api, "nlp")).json()
    assert [e["kind"] for e in events["events"]] == ["submitted", "admitted", "running",
                                                      "succeeded"]


def test_idempotency_key_returns_the_same_job(api):
    first = submit(api, "vision", spec("train", 1), key="dag.task.run.0.1")
    again = submit(api, "vision", spec("train", 1), key="dag.task.run.0.1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = submit(api, "nlp", spec("train", 1), key="dag.task.run.0.1")
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


def test_pending_job_explains_itself_and_starts_when_gpus_free(api):
    big = submit(api, "vision", spec("big", 16, runtime="2h")).json()
    api.tick()
    waiting = submit(api, "nlp", spec("next", 8)).json()
    assert api.tick() == []
    why = api.get(f"/api/v1/jobs/{waiting['id']}/explain", headers=auth(api, "nlp")).json()
    assert why["state"] == "pending" and why["code"] == "Resources"
    assert why["reason"].startswith("needs w 1x(8 GPUs")
    # when big is expected to end: 2h on two hosts under one switch (slowdown 1.1)
    assert 7100 * 1.1 < why["eta_seconds"] <= 7200 * 1.1
    api.delete(f"/api/v1/jobs/{big['id']}", headers=auth(api, "vision"))
    assert api.tick() == [waiting["id"]]


def test_lease_expiry_marks_lost_and_frees_the_gpus(api):
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from airflow_gpu.scheduler_core.store.models import JobRow

    a = submit(api, "vision", spec("a", 16)).json()
    api.tick()
    b = submit(api, "nlp", spec("b", 16)).json()
    assert api.tick() == []                       # a's lease (30 s) holds the GPUs
    with api.service.sessions.begin() as s:       # the launcher fell silent 31 s ago
        s.execute(update(JobRow).where(JobRow.id == a["id"]).values(
            lease_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert api.tick() == [b["id"]]
    assert api.get(f"/api/v1/jobs/{a['id']}", headers=auth(api, "vision")).json()[
        "state"] == "lost"


@pytest.mark.parametrize("method, path, body", [
    ("post", "/api/v1/jobs", {"spec": spec("x", 1)}),
    ("get", "/api/v1/jobs", None),
    ("get", "/api/v1/cluster", None),
    ("delete", "/api/v1/jobs/{id}", None),
    ("post", "/api/v1/jobs/{id}/heartbeat", None),
    ("post", "/api/v1/jobs/{id}/finish", {"outcome": "failed"}),
    ("post", "/api/v1/hosts/dgx-1/drain", None),
    ("post", "/api/v1/hosts/dgx-1/resume", None),
    ("post", "/api/v1/hosts/dgx-1/report", {"gpus": []}),
    ("put", "/api/v1/teams/vision", {"quota_gpus": 1}),
])
def test_no_token_is_401(api, method, path, body):
    job = submit(api, "vision", spec("mine", 1)).json()
    kwargs = {"json": body} if body else {}
    for headers in ({}, {"Authorization": "Bearer nope"}):
        r = getattr(api, method)(path.format(id=job["id"]), headers=headers, **kwargs)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("method, path, body", [
    ("delete", "/api/v1/jobs/{id}", None),
    ("post", "/api/v1/jobs/{id}/heartbeat", None),
    ("post", "/api/v1/jobs/{id}/finish", {"outcome": "failed"}),
    ("post", "/api/v1/hosts/dgx-1/drain", None),
    ("post", "/api/v1/hosts/dgx-1/resume", None),
    ("post", "/api/v1/jobs", {"spec": spec("theirs", 1, team="vision")}),
    ("post", "/api/v1/hosts/dgx-1/report", {"gpus": []}),
    ("put", "/api/v1/teams/nlp", {"quota_gpus": 1}),
])
def test_wrong_team_is_403(api, method, path, body):
    job = submit(api, "vision", spec("mine", 1)).json()
    api.tick()
    kwargs = {"json": body} if body else {}
    r = getattr(api, method)(path.format(id=job["id"]), headers=auth(api, "nlp"), **kwargs)
    assert r.status_code == 403, r.text
    # an admin may
    if "hosts" in path or "jobs/{id}" in path or "teams" in path:
        r = getattr(api, method)(path.format(id=job["id"]), headers=auth(api, "admin"),
                                 **kwargs)
        assert r.status_code == 200, r.text


def test_drain_keeps_new_work_off_a_host(api):
    r = api.post("/api/v1/hosts/dgx-1/drain", headers=auth(api, "admin"))
    assert r.json() == {"name": "dgx-1", "drained": True, "drain_reason": None}
    a = submit(api, "vision", spec("a", 8)).json()
    b = submit(api, "vision", spec("b", 8)).json()
    assert api.tick() == [a["id"]]
    assert api.get(f"/api/v1/jobs/{a['id']}", headers=auth(api, "vision")).json()[
        "replicas"][0]["host"] == "dgx-2"
    api.post("/api/v1/hosts/dgx-1/resume", headers=auth(api, "admin"))
    assert api.tick() == [b["id"]]


@pytest.mark.parametrize("body, status, expected", [
    ({"spec": {**spec("x", 1), "replicaz": 2}}, 422, "replicaz"),
    ({"spec": spec("x", 1), "extra": 1}, 422, "extra"),
    ({"spec": {**spec("x", 1), "name": ""}}, 422, "name"),
    ({"spec": {**spec("x", 1), "priority": 10**30}}, 422, "priority"),
    ({"spec": spec("x", 24)}, 422, "does not fit even on the empty cluster"),
    ({"spec": {**spec("x", 1), "job_class": "nope"}}, 422, "unknown class 'nope'"),
])
def test_bad_submissions_are_4xx_with_the_field(api, body, status, expected):
    r = api.post("/api/v1/jobs", json=body, headers=auth(api, "vision"))
    assert r.status_code == status, r.text
    assert expected in r.text


def test_oversized_body_is_413(api):
    r = api.post("/api/v1/jobs", content=b"{" + b" " * (2 << 20) + b"}",
                 headers={**auth(api, "vision"), "content-type": "application/json"})
    assert r.status_code == 413


def test_unknown_job_is_404_and_finishing_twice_is_harmless(api):
    assert api.get("/api/v1/jobs/nope", headers=auth(api, "vision")).status_code == 404
    job = submit(api, "vision", spec("a", 1)).json()
    api.tick()
    for _ in range(2):
        r = api.post(f"/api/v1/jobs/{job['id']}/finish", json={"outcome": "failed",
                     "exit_code": 3}, headers=auth(api, "vision"))
        assert r.status_code == 200 and r.json()["state"] == "failed"
    r = api.post(f"/api/v1/jobs/{job['id']}/heartbeat", headers=auth(api, "vision"))
    assert r.status_code == 409 and "is failed" in r.text


def test_metrics_and_healthz(api):
    submit(api, "vision", spec("a", 8))
    api.tick()
    text = api.get("/metrics").text
    assert 'airflow_gpu_gpus{host="dgx-1"} 8.0' in text
    assert "airflow_gpu_gpus_allocated{" in text and "8.0" in text
    assert 'airflow_gpu_jobs{state="admitted",team="vision"} 1.0' in text
    assert "airflow_gpu_admissions_total 1.0" in text
    assert "airflow_gpu_scheduling_pass_seconds_count 1.0" in text
    for phase in ("before", "read", "update", "decide", "write"):   # each part of it
        assert f'airflow_gpu_scheduling_pass_phase_seconds_count{{phase="{phase}"}} 1.0' in text
    health = api.get("/healthz").json()
    assert health["status"] == "ok"
    parts = health["last_pass_phases"]
    assert parts["explained"] is True         # a pass run by hand explains
    assert 0 < sum(v for k, v in parts.items() if k != "explained") <= health[
        "last_pass_seconds"]


def test_admins_set_quotas_and_they_apply(api):
    r = api.put("/api/v1/teams/vision", json={"quota_gpus": 8}, headers=auth(api, "vision"))
    assert r.status_code == 403
    r = api.put("/api/v1/teams/vision", json={"quota_gpus": 8, "share": 2},
                headers=auth(api, "admin"))
    assert r.json() == {"name": "vision", "share": 2.0, "quota_gpus": 8, "held_gpus": 0,
                       "borrow_gpus": 0, "borrowed_gpus": 0, "lent_gpus": 0,
                       "reservation_gpus": 0, "error": None,
                       "webhook_url": None, "webhook_events": None, "webhook_secret": None,
                       "webhook_secret_hint": None, "webhook_secret_at": None}
    a = submit(api, "vision", spec("a", 8)).json()
    b = submit(api, "vision", spec("b", 4)).json()
    c = submit(api, "nlp", spec("c", 4)).json()
    # smaller work first: b (4 GPUs) starts; then a (8) would pass vision's quota
    assert sorted(api.tick()) == sorted([b["id"], c["id"]])
    why = api.get(f"/api/v1/jobs/{a['id']}/explain", headers=auth(api, "vision")).json()
    assert why["code"] == "Quota" and "quota_gpus 8" in why["reason"]
    teams = {t["name"]: t for t in api.get("/api/v1/teams", headers=auth(api, "nlp")).json()}
    assert teams["vision"]["held_gpus"] == 4 and teams["nlp"]["quota_gpus"] is None
    r = submit(api, "vision", spec("too-big", 16))
    assert r.status_code == 422 and "quota_gpus 8" in r.text
    r = api.put("/api/v1/teams/vision", json={"quota_gpus": -1}, headers=auth(api, "admin"))
    assert r.status_code == 422 and "quota_gpus" in r.text


def test_host_report_keeps_work_off_an_unhealthy_gpu(api):
    body = {"gpus": [{"index": 3, "healthy": False, "reason": "XID 79"}]}
    assert api.post("/api/v1/hosts/dgx-1/report", json=body,
                    headers=auth(api, "vision")).status_code == 403
    r = api.post("/api/v1/hosts/dgx-1/report", json=body, headers=auth(api, "admin"))
    assert r.status_code == 200, r.text
    assert [g["healthy"] for g in r.json()] == [True, True, True, False] + [True] * 4
    a = submit(api, "vision", spec("whole-1", 8)).json()
    b = submit(api, "vision", spec("whole-2", 8)).json()
    assert api.tick() == [a["id"]]
    got = api.get(f"/api/v1/jobs/{a['id']}", headers=auth(api, "vision")).json()
    assert got["replicas"][0]["host"] == "dgx-2"
    why = api.get(f"/api/v1/jobs/{b['id']}/explain", headers=auth(api, "vision")).json()
    assert why["code"] in ("Resources", "Unhealthy")
    cluster = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()
    gpu3 = cluster["hosts"][0]["gpus"][3]
    assert gpu3["healthy"] is False and gpu3["health_reason"] == "XID 79"
    assert 'airflow_gpu_gpus_healthy{host="dgx-1"} 7.0' in api.get("/metrics").text
    bad = {"gpus": [{"index": 9, "healthy": False}]}
    r = api.post("/api/v1/hosts/dgx-1/report", json=bad, headers=auth(api, "admin"))
    assert r.status_code == 422 and "gpus[].index: 9 is not a GPU of dgx-1" in r.text
    body["gpus"][0]["healthy"] = True
    api.post("/api/v1/hosts/dgx-1/report", json=body, headers=auth(api, "admin"))
    assert api.tick() == [b["id"]]


@pytest.mark.parametrize("method, path, kwargs", [
    ("get", "/api/v1/jobs", {"params": {"team": "\x00"}}),
    ("get", "/api/v1/jobs/a%00b", {}),
    ("post", "/api/v1/hosts/a%00b/drain", {}),
    ("post", "/api/v1/jobs", {"json": {"spec": spec("x", 1), "idempotency_key": "k\x00"}}),
])
def test_nul_characters_are_4xx_not_5xx(api, method, path, kwargs):
    r = getattr(api, method)(path, headers=auth(api, "admin"), **kwargs)
    assert 400 <= r.status_code < 500, r.text


def test_a_stale_launch_cannot_confirm_or_finish_a_new_admission(api):
    """A job requeued (its GPU failed) and admitted again: the launcher of the first
    admission hears 409 on heartbeat and finish; the new admission's launcher is served."""
    body = {**spec("ddp", 8), "job_class": "pytorch"}
    job = submit(api, "vision", body).json()
    api.tick()
    first = api.post(f"/api/v1/jobs/{job['id']}/heartbeat", headers=auth(api, "vision")).json()
    assert first["attempt"] == 1 and first["state"] == "running"
    host = first["replicas"][0]["host"]
    r = api.post(f"/api/v1/hosts/{host}/report", headers=auth(api, "admin"),
                 json={"gpus": [{"index": 0, "healthy": False, "reason": "XID 79"}]})
    assert r.status_code == 200
    assert api.tick() == [job["id"]]                           # admitted again elsewhere
    url = f"/api/v1/jobs/{job['id']}"
    stale = api.post(f"{url}/heartbeat", params={"attempt": 1}, headers=auth(api, "vision"))
    assert stale.status_code == 409 and "admitted again (admission 2)" in stale.json()["detail"]
    r = api.post(f"{url}/finish", headers=auth(api, "vision"),
                 json={"outcome": "succeeded", "exit_code": 0, "attempt": 1})
    assert r.status_code == 409
    fresh = api.post(f"{url}/heartbeat", params={"attempt": 2}, headers=auth(api, "vision"))
    assert fresh.status_code == 200 and fresh.json()["state"] == "running"
    r = api.post(f"{url}/finish", headers=auth(api, "vision"),
                 json={"outcome": "succeeded", "exit_code": 0, "attempt": 2})
    assert r.json()["state"] == "succeeded"


def test_a_job_read_alone_names_its_hosts_addresses(db_url):
    """GET and heartbeat give each replica its host's address and Docker engine, as the
    cluster view has them, so a launcher reads no cluster; a listed job does not."""
    from tests.databases import serve

    hosts = ({"name": "dgx-1", "model": "dgx-a100", "rack": "r1", "switch": "s1",
              "address": "10.0.0.1", "docker_url": "tcp://10.0.0.1:2376"},
             {"name": "dgx-2", "model": "dgx-a100", "rack": "r1", "switch": "s1"})
    for api in serve(db_url, hosts=hosts):
        ids = [submit(api, "vision", spec(f"j{i}", 8)).json()["id"] for i in range(2)]
        api.tick()
        view = {h["name"]: h for h in api.get("/api/v1/cluster",
                                              headers=auth(api, "nlp")).json()["hosts"]}
        seen = set()
        for job_id in ids:
            for how in ("get", "post"):
                path = f"/api/v1/jobs/{job_id}" + ("/heartbeat" if how == "post" else "")
                (r,) = getattr(api, how)(path, headers=auth(api, "vision")).json()["replicas"]
                assert (r["address"], r["docker_url"]) == (view[r["host"]]["address"],
                                                           view[r["host"]]["docker_url"])
                seen.add((r["host"], r["address"], r["docker_url"]))
        assert seen == {("dgx-1", "10.0.0.1", "tcp://10.0.0.1:2376"), ("dgx-2", "dgx-2", None)}
        listed = api.get("/api/v1/jobs", headers=auth(api, "nlp")).json()
        assert [r["address"] for j in listed for r in j["replicas"]] == [None, None]
