"""Webhooks through real server processes (tests/servers.py) to a real receiver on
loopback: the receiver is down (connection refused) for 12 s while a job's events
happen, then comes up, and every event arrives once, in order, validly signed (SQLite and
PostgreSQL); and with two replicas on PostgreSQL, each notification is delivered once,
by the leader, also after the leader is killed."""

from __future__ import annotations

import time

import httpx
import pytest
import yaml
from sqlalchemy import select

from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import sessions
from airflow_gpu.scheduler_core.store.models import NotificationRow
from tests.databases import HOSTS, _drop_pg_schema, _pg_schema_url
from tests.helpers import until
from tests.servers import Server, prepared
from tests.webhooks import Receiver

OUTAGE = 12.0          # seconds the receiver is down: retries at 1 s, then every 2 s
EVERYTHING = ["start", "end", "failure", "preemption", "requeue"]


def policy_file(tmp_path) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"notifications": {
        "allowed_urls": ["http://127.0.0.1:"], "retry_first": 1, "retry_max": 2,
        "timeout": 2}}))
    return str(path)


class Api:
    """A team's and an admin's client of one server."""

    def __init__(self, url: str, token: str, admin: str):
        self.team = httpx.Client(base_url=url, timeout=10,
                                 headers={"Authorization": f"Bearer {token}"})
        self.admin = httpx.Client(base_url=url, timeout=10,
                                  headers={"Authorization": f"Bearer {admin}"})

    def call(self, method: str, path: str, admin: bool = False, **kw) -> dict:
        r = (self.admin if admin else self.team).request(method, path, **kw)
        assert r.status_code in (200, 201), r.text
        return r.json()

    def state(self, job_id: str, *states: str) -> dict:
        return until(lambda: (j := self.call("GET", f"/api/v1/jobs/{job_id}"))["state"]
                     in states and j, f"job {job_id} {'/'.join(states)}")

    def live(self, name: str) -> dict:
        """Submit a job and take it to running (admitted, then a heartbeat)."""
        j = self.call("POST", "/api/v1/jobs", json={"spec": {
            "name": name, "expected_runtime": "1h", "roles": [{"name": "w", "gpus": 1}]}})
        j = self.state(j["id"], "admitted")
        return self.call("POST", f"/api/v1/jobs/{j['id']}/heartbeat",
                         params={"attempt": j["attempt"]})

    def finish(self, j: dict, outcome: str, code: int | None = None) -> dict:
        return self.call("POST", f"/api/v1/jobs/{j['id']}/finish", json={
            "outcome": outcome, "exit_code": code, "attempt": j["attempt"]})

    def story(self) -> list[tuple[str, str]]:
        """A job admitted, requeued (by airflow-gpu requeue), admitted again and
        succeeded; a second one that fails. Returns the (event, kind) pairs told."""
        a = self.live("a")
        self.call("POST", f"/api/v1/jobs/{a['id']}/requeue")
        a = self.finish(self.state(a["id"], "preempting"), "preempted")
        a = self.state(a["id"], "admitted")
        a = self.call("POST", f"/api/v1/jobs/{a['id']}/heartbeat",
                      params={"attempt": a["attempt"]})
        self.finish(a, "succeeded", 0)
        self.finish(self.live("b"), "failed", 1)
        starts = [("admitted", "start"), ("running", "start")]
        return [*starts, ("requeue", "preemption"), ("requeued", "requeue"), *starts,
                ("succeeded", "end"), *starts, ("failed", "failure")]


def first_attempts(engine) -> int:
    """Attempts of the oldest notification (a short read: on SQLite a transaction of the
    test's would hold the server's writes up)."""
    with sessions(engine)() as s:
        return s.scalar(select(NotificationRow.attempts).order_by(NotificationRow.id)
                        .limit(1)) or 0


def states(engine) -> set[str]:
    with sessions(engine)() as s:
        return set(s.scalars(select(NotificationRow.state)))


def serving(db_url: str, tmp_path, replicas: int = 1):
    engine, token, cluster = prepared(db_url, tmp_path, {"cluster": "n", "hosts": list(HOSTS)},
                                      "vision")
    admin = create_token(sessions(engine), "ops", admin=True)
    servers = [Server(db_url, cluster, log=tmp_path / f"server-{i}.log",
                      args=("--policy-file", policy_file(tmp_path)))
               for i in range(replicas)]
    return engine, servers, [Api(s.url, token, admin) for s in servers]


def test_every_event_arrives_once_in_order_and_signed_after_an_outage(tmp_path):
    # on SQLite: the store's part (claims, retries on PostgreSQL) is the two replicas' below
    db_url = f"sqlite:///{tmp_path / 'airflow-gpu.db'}"
    engine, (server,), (api,) = serving(db_url, tmp_path)
    receiver = Receiver()            # not listening: connections are refused
    try:
        secret = api.call("PUT", "/api/v1/teams/vision", admin=True, json={
            "webhook_url": receiver.url, "webhook_events": EVERYTHING,
            "webhook_secret": "new"})["webhook_secret"]
        down_at = time.monotonic()
        told = api.story()
        until(lambda: first_attempts(engine) >= 2, "retries while the receiver is down")
        assert time.monotonic() - down_at < OUTAGE, "the story took longer than the outage"
        time.sleep(OUTAGE - (time.monotonic() - down_at))
        receiver.start()
        bodies = receiver.wait(len(told), timeout=15)
        time.sleep(1.5)                    # nothing more comes
        assert len(receiver.got) == len(told)
        assert [(b["event"], b["kind"]) for b in bodies] == told
        ids = [b["event_id"] for b in bodies]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert len({h["x-airflow-gpu-delivery"] for h, _ in receiver.got}) == len(told)
        assert all(receiver.signed_with(secret))
        with sessions(engine)() as s:
            rows = list(s.scalars(select(NotificationRow).order_by(NotificationRow.id)))
        assert {r.state for r in rows} == {"delivered"} and len(rows) == len(told)
        assert rows[0].attempts > 2            # the first waited out the outage
        jobs = {b["job"]["name"] for b in bodies}
        assert jobs == {"a", "b"}
    finally:
        receiver.stop()
        server.stop()
        engine.dispose()


@pytest.fixture
def pg_url():
    schema, url = _pg_schema_url()
    try:
        yield url
    finally:
        _drop_pg_schema(schema)


def test_two_replicas_on_postgresql_deliver_each_notification_once(pg_url, tmp_path):
    engine, servers, apis = serving(pg_url, tmp_path, replicas=2)
    receiver = Receiver().start()
    try:
        until(lambda: any(s.healthy()["scheduling"] for s in servers), "a leader")
        secret = apis[0].call("PUT", "/api/v1/teams/vision", admin=True, json={
            "webhook_url": receiver.url, "webhook_events": EVERYTHING,
            "webhook_secret": "new"})["webhook_secret"]
        told = apis[0].story() + apis[1].story()        # changes through both replicas
        receiver.wait(len(told))
        until(lambda: states(engine) == {"delivered"}, "every notification marked delivered")
        leader = next(i for i, s in enumerate(servers) if s.healthy()["scheduling"])
        servers[leader].kill()                          # the other one delivers now
        told += apis[1 - leader].story()
        bodies = receiver.wait(len(told), timeout=30)
        time.sleep(1.5)
        assert len(receiver.got) == len(told)
        assert [(b["event"], b["kind"]) for b in bodies] == told
        assert len({b["delivery_id"] for b in bodies}) == len(told)
        assert all(receiver.signed_with(secret))
    finally:
        receiver.stop()
        for s in servers:
            s.stop()
        engine.dispose()
