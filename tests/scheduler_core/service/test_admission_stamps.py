"""Admission times on the real service (SQLite and PostgreSQL): a job that takes the GPUs
another job freed is never admitted before that job ended, even when the finish commits
while the pass waits for the database; a heartbeat's lease counts from when it was
written, not from before a wait for the database."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.databases import team_client

TTL = 60.0


@pytest.fixture
def client(db_url):
    yield from team_client(db_url, lease_ttl=TTL)


def submit(c, name: str) -> str:
    r = c.post("/api/v1/jobs", json={"spec": {"name": name, "roles": [
        {"name": "w", "replicas": 2, "gpus": 8}]}})          # both hosts: one at a time
    assert r.status_code == 201, r.text
    return r.json()["id"]


def at(iso: str) -> datetime:
    t = datetime.fromisoformat(iso)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def test_a_job_is_admitted_after_the_job_whose_gpus_it_takes_ended(client):
    first, second = submit(client, "first"), submit(client, "second")
    client.service.schedule_pass()
    assert client.post(f"/api/v1/jobs/{first}/heartbeat").status_code == 200

    def finish_meanwhile(session) -> None:
        # called by the pass after it read its clock and before it reads the state: the
        # finish commits in between, as when the pass waited for SQLite's write lock
        time.sleep(0.05)
        r = client.post(f"/api/v1/jobs/{first}/finish", json={"outcome": "succeeded"})
        assert r.status_code == 200, r.text

    client.service.leader_fence = finish_meanwhile
    try:
        assert client.service.schedule_pass() == [second]
    finally:
        del client.service.leader_fence
    ended = client.get(f"/api/v1/jobs/{first}").json()
    started = client.get(f"/api/v1/jobs/{second}").json()
    assert at(started["admitted_at"]) >= at(ended["finished_at"]), (started, ended)


def test_a_heartbeat_that_waited_for_the_database_gets_its_whole_lease(client, db_url):
    if not db_url.startswith("sqlite"):
        pytest.skip("PostgreSQL has no database-wide write lock to wait for")
    job = submit(client, "job")
    client.service.schedule_pass()
    answered: list = []
    with client.service.sessions.begin() as s:
        s.connection()                           # holds SQLite's write lock
        beat = threading.Thread(target=lambda: answered.append(
            client.post(f"/api/v1/jobs/{job}/heartbeat")))
        beat.start()
        time.sleep(1.0)                          # the heartbeat waits for it
        released = datetime.now(UTC)
    beat.join(30)
    assert answered and answered[0].status_code == 200, answered
    got = answered[0].json()
    assert got["state"] == "running"
    # counted from when it was written, after the wait: not a second short
    assert at(got["lease_expires_at"]) >= released + timedelta(seconds=TTL - 0.1), got
