"""Limits on requests (issue "Service hardening", points 1, 2 and 9), on the real service
with SQLite and PostgreSQL: a body of 52,000 roles or a 20 MiB chunked body is answered at
once (422, 413) while another team's launcher keeps heartbeating and its job stays
running; errors never echo the input; NaN, Infinity, 1e400 and lone surrogates are a 422
naming the field, never a 500."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import yaml

from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.servers import Server

MIB = 1 << 20


def many_roles(n: int) -> bytes:
    """A submit of n roles: 52,000 are 1.03 MB, under the 1 MiB limit."""
    return json.dumps({"spec": {"name": "big", "roles": [{"name": f"r{i}"}
                                                         for i in range(n)]}}).encode()


def chunked(total: int, piece: int = 64 * 1024):
    """A submit body of `total` bytes, sent chunked (no Content-Length)."""
    yield b'{"spec": {"name": "big", "roles": ['
    role = b'{"name": "r"},'
    sent, block = 0, role * (piece // len(role))
    while sent < total:
        yield block
        sent += len(block)
    yield b'{"name": "r"}]}}'


@pytest.fixture
def live(db_url, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"hosts": [{"name": "dgx-1", "model": "dgx-a100"}]}))
    engine = make_engine(db_url)
    upgrade(engine)
    tokens = {t: create_token(sessions(engine), t) for t in ("nlp", "vision")}
    server = Server(db_url, cluster, lease_ttl=3, interval=0.1, log=tmp_path / "server.log")
    server.tokens = tokens
    yield server
    server.stop()
    engine.dispose()


class Heartbeats(threading.Thread):
    """A launcher heartbeating its job every 0.2 s; every failure is kept."""

    def __init__(self, url: str, token: str, job_id: str):
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=url, timeout=2,
                                   headers={"Authorization": f"Bearer {token}"})
        self.job_id, self.ok, self.failed = job_id, 0, []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                r = self.client.post(f"/api/v1/jobs/{self.job_id}/heartbeat")
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"{r.status_code} {r.text[:200]}")
            except httpx.HTTPError as e:
                self.failed.append(repr(e))
            self.done.wait(0.2)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)
        self.client.close()


def running_job(server: Server) -> tuple[str, Heartbeats]:
    headers = {"Authorization": f"Bearer {server.tokens['nlp']}"}
    r = httpx.post(f"{server.url}/api/v1/jobs", headers=headers, timeout=10, json={
        "spec": {"name": "victim", "expected_runtime": "1h",
                 "roles": [{"name": "w", "gpus": 1}]}})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    end = time.monotonic() + 20
    while httpx.get(f"{server.url}/api/v1/jobs/{job_id}", headers=headers,
                    timeout=10).json()["state"] != "admitted":
        assert time.monotonic() < end, "the victim job was never admitted"
        time.sleep(0.05)
    beats = Heartbeats(server.url, server.tokens["nlp"], job_id)
    beats.start()
    return job_id, beats


def check_still_running(server: Server, job_id: str, beats: Heartbeats) -> None:
    time.sleep(1)                  # heartbeats after the large requests, too
    beats.stop()
    assert beats.failed == [], f"heartbeats failed: {beats.failed[:5]}"
    assert beats.ok >= 5
    r = httpx.get(f"{server.url}/api/v1/jobs/{job_id}", timeout=10,
                  headers={"Authorization": f"Bearer {server.tokens['nlp']}"})
    assert r.json()["state"] == "running", r.json()


def test_52000_roles_are_refused_at_once_and_other_heartbeats_keep_flowing(live):
    job_id, beats = running_job(live)
    body = many_roles(52_000)
    assert MIB - 50_000 < len(body) < MIB
    time.sleep(0.5)
    r = httpx.post(f"{live.url}/api/v1/jobs", content=body, timeout=60, headers={
        "Authorization": f"Bearer {live.tokens['vision']}", "Content-Type": "application/json"})
    assert r.status_code == 422, r.text[:500]
    detail = r.json()["detail"]
    assert detail[0]["loc"] == ["body", "spec", "roles"]
    assert "at most 64 roles, got 52000" in detail[0]["msg"]
    assert len(r.content) < 2000 and b"r51999" not in r.content     # no echo of the input
    check_still_running(live, job_id, beats)


def test_a_20_mib_chunked_body_is_cut_off_with_413_and_other_heartbeats_keep_flowing(live):
    job_id, beats = running_job(live)
    time.sleep(0.5)
    with httpx.Client(timeout=60) as client:
        r = client.post(f"{live.url}/api/v1/jobs", content=chunked(20 * MIB), headers={
            "Authorization": f"Bearer {live.tokens['vision']}",
            "Content-Type": "application/json"})
    assert r.status_code == 413, r.text[:500]
    assert "over the limit of 1048576 bytes" in r.json()["detail"]
    assert len(r.content) < 2000
    # a client that declares its size is refused before it sends
    r = httpx.post(f"{live.url}/api/v1/jobs", content=b"{" + b" " * (2 * MIB) + b"}",
                   timeout=60, headers={"Authorization": f"Bearer {live.tokens['vision']}",
                                        "Content-Type": "application/json"})
    assert r.status_code == 413, r.text[:500]
    check_still_running(live, job_id, beats)


# -- the same through the app on its store (the `api` fixture) ----------------------------

def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}", "Content-Type": "application/json"}


def test_caps_on_roles_and_replicas_name_the_field_and_the_fix(api):
    def submit(roles: list[dict]):
        return api.post("/api/v1/jobs", headers=auth(api, "vision"),
                        json={"spec": {"name": "j", "roles": roles}})

    r = api.post("/api/v1/jobs", content=many_roles(52_000), headers=auth(api, "vision"))
    assert r.status_code == 422 and len(r.content) < 2000, r.text[:500]
    assert "a job has at most 64 roles, got 52000" in r.text
    r = submit([{"name": f"r{i}"} for i in range(65)])
    assert r.status_code == 422 and "at most 64 roles, got 65" in r.text
    assert submit([{"name": f"r{i}"} for i in range(64)]).status_code == 201
    r = submit([{"name": "a", "replicas": 4096}, {"name": "b", "replicas": 1}])
    assert r.status_code == 422 and "4097 replicas in all" in r.text, r.text
    r = submit([{"name": "a", "replicas": 4097}])
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "replicas"
    r = submit([{"name": "a"}, {"name": "b"}, {"name": "a"}])
    assert r.status_code == 422 and "'a' repeats" in r.text


def test_422_never_echoes_the_input(api):
    junk = "x" * 200_000
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"),
                 json={"spec": {"name": junk, "roles": [{"name": "w", "memory": junk}]},
                       "idempotency_key": junk, junk: 1})
    assert r.status_code == 422
    assert len(r.content) < 4000 and "x" * 200 not in r.text, r.text[:500]
    locs = [d["loc"] for d in r.json()["detail"]]
    assert ["body", "spec", "name"] in locs and ["body", "idempotency_key"] in locs
    # an unknown field in every one of many roles: the errors listed are capped
    roles = [{"name": f"r{i}", **{f"k{j}": 1 for j in range(1000)}} for i in range(60)]
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"),
                 json={"spec": {"name": "j", "roles": roles}})
    assert r.status_code == 422 and len(r.json()["detail"]) == 21
    assert "more errors" in r.json()["detail"][-1]["msg"]


# where each request puts the value: (method, path, who, body with @ for the value, loc)
PLACES = [
    ("POST", "/api/v1/jobs", "vision",
     '{"spec": {"name": "j", "roles": [{"name": "w", "memory": @}]}}',
     ["body", "spec", "roles", 0, "memory"]),
    ("POST", "/api/v1/jobs", "vision",
     '{"spec": {"name": "j", "roles": [{"name": "w", "gpu": {"min_memory": @}}]}}',
     ["body", "spec", "roles", 0, "gpu", "min_memory"]),
    ("POST", "/api/v1/jobs", "vision",
     '{"spec": {"name": "j", "expected_runtime": @, "roles": [{"name": "w"}]}}',
     ["body", "spec", "expected_runtime"]),
    ("POST", "/api/v1/jobs", "vision",
     '{"spec": {"name": "j", "time_limit": @, "roles": [{"name": "w"}]}}',
     ["body", "spec", "time_limit"]),
    ("PUT", "/api/v1/teams/vision", "admin", '{"share": @}', ["body", "share"]),
    ("POST", "/api/v1/hosts/dgx-1/report", "admin",
     '{"gpus": [{"index": 0, "healthy": true, "power_watts": @}]}',
     ["body", "gpus", 0, "power_watts"]),
    ("POST", "/api/v1/hosts/dgx-1/report", "admin",
     '{"gpus": [{"index": 0, "healthy": true, "utilization_gpu": @}]}',
     ["body", "gpus", 0, "utilization_gpu"]),
]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("method,path,who,body,loc", PLACES,
                         ids=[p[4][-1] for p in PLACES])
def test_non_finite_numbers_are_422_naming_the_field(api, value, method, path, who, body, loc):
    r = api.request(method, path, content=body.replace("@", value), headers=auth(api, who))
    assert r.status_code == 422, r.text
    assert loc in [d["loc"] for d in r.json()["detail"]], r.text
    assert "finite number" in r.text


@pytest.mark.parametrize("body,loc", [
    ('{"spec": {"name": "j", "roles": [{"name": "w"}]}, "idempotency_key": "a\\ud800"}',
     ["body", "idempotency_key"]),
    ('{"spec": {"name": "j", "job_class": "\\udc00x", "roles": [{"name": "w"}]}}',
     ["body", "spec", "job_class"]),
    ('{"spec": {"name": "j", "roles": [{"name": "w", "gpu": {"model": ["A100\\ud83d"]}}]}}',
     ["body", "spec", "roles", 0, "gpu", "model", 0]),
    ('{"spec": {"name": "j", "roles": [{"name": "w", "\\ud800": 1}]}}',
     ["body", "spec", "roles", 0, "\\ud800"]),
], ids=["idempotency_key", "job_class", "gpu.model", "a key"])
def test_a_lone_surrogate_is_422_naming_the_field(api, body, loc):
    r = api.post("/api/v1/jobs", content=body, headers=auth(api, "vision"))
    assert r.status_code == 422, r.text
    assert loc in [d["loc"] for d in r.json()["detail"]], r.text
    assert "lone surrogate" in r.text
    # a pair is a character, and is taken
    ok = api.post("/api/v1/jobs", headers=auth(api, "vision"), content=(
        '{"spec": {"name": "j", "roles": [{"name": "w"}]}, "idempotency_key": "a\\ud83d\\ude00"}'))
    assert ok.status_code in (200, 201), ok.text


@pytest.mark.parametrize("field,value,says", [
    ("memory", "1e300", "over the largest there is"),
    ("memory", '"' + "9" * 400 + 'GiB"', "finite number"),
    ("memory", "1" + "0" * 40, "over the largest there is"),
    ("expected_runtime", "1e300", "over the longest accepted"),
    ("time_limit", "1" + "0" * 40, "over the longest accepted"),
])
def test_sizes_and_durations_too_large_to_hold_are_422(api, field, value, says):
    role = f', "{field}": {value}' if field == "memory" else ""
    job = f', "{field}": {value}' if field != "memory" else ""
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"), content=(
        f'{{"spec": {{"name": "j"{job}, "roles": [{{"name": "w"{role}}}]}}}}'))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][-1] == field and says in r.text, r.text


def test_after_the_service_itself_stalled_leases_are_extended_not_expired(api):
    """A lease measures the launcher against the service's own responsiveness: when this
    process could not check leases for longer than a third of one (frozen, starved), the
    launchers may not have reached it either, so nothing is marked lost for that gap."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from airflow_gpu.scheduler_core.store.models import JobRow

    body = {"spec": {"name": "a", "roles": [{"name": "w", "gpus": 8}]}}
    job = api.post("/api/v1/jobs", json=body, headers=auth(api, "vision")).json()
    api.tick()                                         # admitted, leases checked now
    with api.service.sessions.begin() as s:            # its lease ran out 5 s ago ...
        s.execute(update(JobRow).where(JobRow.id == job["id"]).values(
            lease_expires_at=datetime.now(UTC) - timedelta(seconds=5)))
    api.app.state.loop.lease_checks.stalls._last -= 20  # ... while the service stalled 20 s
    api.tick()
    got = api.get(f"/api/v1/jobs/{job['id']}", headers=auth(api, "vision")).json()
    assert got["state"] == "admitted"                  # extended by the stall, not lost
    api.tick()                                         # no stall now: the lease still holds
    assert api.get(f"/api/v1/jobs/{job['id']}", headers=auth(api, "vision")).json()[
        "state"] == "admitted"
    with api.service.sessions.begin() as s:            # and a lease that truly ran out
        s.execute(update(JobRow).where(JobRow.id == job["id"]).values(
            lease_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    api.tick()
    assert api.get(f"/api/v1/jobs/{job['id']}", headers=auth(api, "vision")).json()[
        "state"] == "lost"
