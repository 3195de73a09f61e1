"""Time limits on the real service (SQLite and PostgreSQL): a live job past its limit and
grace ends `timeout` and frees its GPUs whether or not its launcher says so; a job backfilled
ahead of a reservation keeps its limit and yields at the reservation: past its estimate
it is stopped and requeued, never timed out; limits above a maximum are refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import HOSTS
from tests.helpers import make_cluster


@pytest.fixture
def client(db_url):
    """The app on its store, protecting the oldest blocked job at once (reserve_after 0)."""
    service = Service(Settings(db_url, make_cluster(*HOSTS),
                               policy=PolicyConfig(reserve_after=0, stop_grace=20)))
    app = create_app(service, run_loop=False)
    token = create_token(service.sessions, "vision")
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {token}"
        c.tick, c.service = app.state.loop.tick, service
        yield c
    service.engine.dispose()


def submit(c, name: str, gpus: int, **fields) -> dict:
    roles = [{"name": "w", "replicas": gpus // 8, "gpus": 8}]
    r = c.post("/api/v1/jobs", json={"spec": {"name": name, "roles": roles, **fields}})
    assert r.status_code == 201, r.text
    return r.json()


def job(c, job_id: str) -> dict:
    return c.get(f"/api/v1/jobs/{job_id}").json()


def past_deadline(c, job_id: str, ago: float, limit: float) -> None:
    """Move the job back in time: admitted `limit` seconds before its deadline, `ago`
    seconds ago."""
    deadline = datetime.now(UTC) - timedelta(seconds=ago)
    with c.service.sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(
            deadline_at=deadline, admitted_at=deadline - timedelta(seconds=limit)))


def test_a_job_past_its_limit_and_grace_ends_timeout_and_its_gpus_return(client):
    a = submit(client, "a", 16, time_limit="10m", expected_runtime="5m")
    client.tick()
    assert client.post(f"/api/v1/jobs/{a['id']}/heartbeat").status_code == 200
    got = job(client, a["id"])
    assert (got["state"], got["time_limit_s"], got["stop_grace"]) == ("running", 600, 20)
    b = submit(client, "b", 16)
    past_deadline(client, a["id"], 5, 600)            # stopped 5 s ago: within its grace
    assert client.tick() == [] and job(client, a["id"])["state"] == "running"
    past_deadline(client, a["id"], 21, 600)           # grace over, launcher silent or gone
    assert client.tick() == [b["id"]]
    assert job(client, a["id"])["state"] == "timeout"
    events = client.get(f"/api/v1/jobs/{a['id']}/explain").json()
    ended = [e["message"] for e in events["events"] if e["kind"] == "timeout"]
    assert len(ended) == 1 and "time limit of 10m" in ended[0] and "released" in ended[0]
    assert events["time_limit_s"] == 600 and events["elapsed_s"] >= 621
    r = client.post(f"/api/v1/jobs/{a['id']}/heartbeat")
    assert r.status_code == 409 and "timeout" in r.text     # the launcher stops its replicas


def test_a_launcher_reports_the_timeout_itself(client):
    a = submit(client, "a", 8, time_limit="1h")
    client.tick()
    r = client.post(f"/api/v1/jobs/{a['id']}/finish", json={"outcome": "timeout"})
    assert r.status_code == 200 and r.json()["state"] == "timeout"
    assert client.get("/api/v1/cluster").json()["gpus_allocated"] == 0


def backfilled(c) -> tuple[dict, dict, dict]:
    """`a` holds one host for an hour; `big` needs both and is reserved from a's end;
    `small` (10 minutes expected, a day's limit) starts now on the other host, ahead of
    big's reservation."""
    a = submit(c, "a", 8, expected_runtime="1h")
    c.tick()
    big = submit(c, "big", 16, expected_runtime="1h")
    small = submit(c, "small", 8, expected_runtime="10m", time_limit="1d")
    assert c.tick() == [small["id"]]
    return a, big, small


def test_backfill_keeps_the_limit_and_sets_the_yield_of_a_job_ahead_of_a_reservation(
        client):
    """Its limit stays its own (a day); it yields at big's reservation, an hour off."""
    a, big, small = backfilled(client)
    got = job(client, small["id"])
    assert got["limit_cut_by"] == big["id"] and got["time_limit_s"] == 86400
    left = (datetime.fromisoformat(got["yield_at"]) - datetime.now(UTC)).total_seconds()
    assert 3500 <= left <= 3600                          # a's planned end
    explain = client.get(f"/api/v1/jobs/{small['id']}/explain").json()
    admitted = next(e["message"] for e in explain["events"] if e["kind"] == "admitted")
    assert "time limit 1d" in admitted and big["id"][:8] in admitted    # by short id
    assert "requeued under the same id" in admitted
    with client.service.sessions.begin() as s:           # the promise survives the pass
        assert s.get(JobRow, big["id"]).promised_at is not None
    a_row = job(client, a["id"])
    assert a_row["limit_cut_by"] is None and a_row["deadline_at"] is None   # no limit
    assert a_row["yield_at"] is None


def overran(c, small: dict, a: dict) -> None:
    """`a` ended; `small` is still running a second past its yield."""
    assert c.post(f"/api/v1/jobs/{small['id']}/heartbeat").status_code == 200
    c.post(f"/api/v1/jobs/{a['id']}/finish", json={"outcome": "succeeded"})
    with c.service.sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == small["id"]).values(
            yield_at=datetime.now(UTC) - timedelta(seconds=1)))


@pytest.mark.parametrize("launcher", ["confirms", "silent"])
def test_a_backfilled_job_that_overruns_is_stopped_and_requeued_never_timed_out(
        client, launcher):
    """Past its expected runtime into big's reservation, small gets its class's signal and
    its grace, then goes back to the queue under the same id (its launcher confirms the
    stop, or the grace passes), behind big even where it was submitted first; big starts
    on the GPUs; nothing ends `timeout`."""
    a, big, small = backfilled(client)
    with client.service.sessions.begin() as s:     # small the older job: it still queues
        big_at = s.get(JobRow, big["id"]).submitted_at    # behind big once it overran
        s.execute(update(JobRow).where(JobRow.id == small["id"]).values(
            submitted_at=big_at - timedelta(hours=1)))
    overran(client, small, a)
    assert client.tick() == []                   # small still holds its host: stopping
    got = job(client, small["id"])
    assert (got["state"], got["preempt_signal"], got["preempt_grace"]) == (
        "preempting", "SIGTERM", 20)
    assert got["preempt_reason"].startswith("overran its expected runtime of 10m")
    assert big["id"][:8] in got["preempt_reason"]
    r = client.post(f"/api/v1/jobs/{small['id']}/heartbeat")
    assert r.status_code == 200 and r.json()["state"] == "preempting"   # the launcher hears
    if launcher == "confirms":
        r = client.post(f"/api/v1/jobs/{small['id']}/finish", json={"outcome": "preempted"})
        assert r.status_code == 200, r.text
    else:
        with client.service.sessions.begin() as s:
            s.execute(update(JobRow).where(JobRow.id == small["id"]).values(
                preempt_deadline_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert client.tick() == [big["id"]]          # the reserved job first
    got = job(client, small["id"])
    assert (got["state"], got["requeue_reason"], got["yield_at"]) == (
        "pending", "overrun", None)
    with client.service.sessions.begin() as s:
        assert s.get(JobRow, small["id"]).queued_at > big_at
    events = client.get(f"/api/v1/jobs/{small['id']}/explain").json()["events"]
    kinds = [e["kind"] for e in events]
    assert "timeout" not in kinds and kinds.count("overrun") == 1
    requeued = next(e["message"] for e in events if e["kind"] == "requeued")
    assert requeued.startswith("overran its expected runtime of 10m")
    assert "back in the queue under the same id" in requeued


def test_a_backfilled_job_runs_on_past_its_yield_when_the_reserved_job_no_longer_waits(
        client):
    """big was cancelled: nothing needs small's host at its yield, so it is not stopped."""
    a, big, small = backfilled(client)
    assert client.delete(f"/api/v1/jobs/{big['id']}").status_code == 200
    overran(client, small, a)
    client.tick()
    got = job(client, small["id"])
    assert (got["state"], got["yield_at"], got["preempt_reason"]) == ("running", None, None)


def test_raising_a_backfilled_jobs_limit_keeps_its_yield(client):
    """An admin may raise the limit of a job that backfills; its yield does not move."""
    _, _, small = backfilled(client)
    before = job(client, small["id"])["yield_at"]
    admin = create_token(client.service.sessions, "ops", admin=True)
    r = client.patch(f"/api/v1/jobs/{small['id']}", json={"time_limit": "2d"},
                     headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200, r.text
    got = job(client, small["id"])
    assert got["time_limit_s"] == 2 * 86400 and got["yield_at"] == before


@pytest.mark.parametrize("fields, words", [
    ({"time_limit": "3d", "job_class": "validation"},
     ["time_limit", "3d", "validation", "1d"]),
    ({"time_limit": "1h", "expected_runtime": "2h"},
     ["expected_runtime", "2h", "time_limit", "1h"]),
])
def test_limits_above_the_maximum_or_below_the_estimate_are_refused(client, fields, words):
    r = client.post("/api/v1/jobs", json={"spec": {
        "name": "x", "roles": [{"name": "w", "gpus": 1}], **fields}})
    assert r.status_code == 422, r.text
    assert all(w in r.text for w in words), r.text
