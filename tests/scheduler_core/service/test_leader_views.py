"""On the replica that leads, with its loop running, the queue views (squeue, sprio,
sshare) read the leader's own engine instead of building a scheduler from every row
(service/leaderview.py), yet show what the store holds when asked: a job updated or
submitted a moment ago is where the next pass puts it. SQLite and PostgreSQL, the real
app and loop."""

from __future__ import annotations

import time

import pytest

from airflow_gpu.scheduler_core.service import priority, storepass
from tests.databases import team_client


@pytest.fixture
def live(db_url):
    yield from team_client(db_url, run_loop=True, lease_ttl=30)


def submit(api, name: str, gpus: int = 8) -> str:
    r = api.post("/api/v1/jobs", json={"spec": {
        "name": name, "expected_runtime": "1h", "roles": [{"name": "w", "gpus": gpus}]}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def until(check, seconds: float = 20.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if out := check():
            return out
        time.sleep(0.05)
    raise AssertionError("not reached")


def test_views_on_the_leader_read_its_engine_brought_up_to_date_as_asked(
        live, monkeypatch):
    busy = [submit(live, f"busy{i}") for i in range(2)]      # two hosts of 8 GPUs: full
    until(lambda: all(live.get(f"/api/v1/jobs/{i}").json()["state"] == "admitted"
                      for i in busy))

    def built(*args, **kw):
        raise AssertionError("a view built a scheduler on the leader")

    monkeypatch.setattr(priority, "_built", built)
    real = storepass.warm.read

    def slow(*args, **kw):      # each pass reads the store half a second after it began
        time.sleep(0.5)
        return real(*args, **kw)

    monkeypatch.setattr(storepass.warm, "read", slow)
    submit(live, "first")
    second = submit(live, "second")

    def names(path: str) -> list[str]:
        return [j["name"] for j in live.get(path).json()["jobs"]]

    assert names("/api/v1/priorities") == ["first", "second"]   # waited for their pass
    r = live.patch(f"/api/v1/jobs/{second}", json={"priority": 10})
    assert r.status_code == 200, r.text
    assert names("/api/v1/priorities") == ["second", "first"]
    third = submit(live, "third")
    queue = live.get("/api/v1/queue?state=pending").json()
    assert [(j["name"], j["rank"]) for j in queue] == [("second", 1), ("first", 2),
                                                       ("third", 3)]
    shares = {t["name"]: t for t in live.get("/api/v1/shares").json()}
    assert shares["vision"]["pending_jobs"] == 3 and shares["vision"]["live_jobs"] == 2
    r = live.delete(f"/api/v1/jobs/{third}")
    assert r.status_code == 200, r.text
    assert names("/api/v1/priorities") == ["second", "first"]


def test_where_no_loop_runs_a_view_builds_the_scheduler_as_the_next_pass_would(api):
    """Passes run by hand (tick): a job submitted since the last pass is in the order
    all the same."""
    from tests.scheduler_core.store.test_bad_rows import submit as submitted

    submitted(api, "a", 8)
    api.tick()
    later = submitted(api, "later", 8)
    prio = api.get("/api/v1/priorities",
                   headers={"Authorization": f"Bearer {api.tokens['vision']}"}).json()
    assert [j["id"] for j in prio["jobs"]] == [later]
