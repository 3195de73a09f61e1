"""The service learns the locality slowdown from the jobs that ran to their end, shows it,
and plans with it (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from airflow_gpu.scheduler_core.store.models import JobRow
from tests.scheduler_core.api.test_api import auth, spec, submit

HOUR = 3600


def run_to_end(api, team: str, body: dict, hours: float) -> str:
    """Submit, admit, start and finish a job, then date it as if it had run `hours`."""
    job = submit(api, team, body).json()
    assert api.tick() == [job["id"]]
    r = api.post(f"/api/v1/jobs/{job['id']}/heartbeat", headers=auth(api, team))
    assert r.status_code == 200
    r = api.post(f"/api/v1/jobs/{job['id']}/finish", json={"outcome": "succeeded"},
                 headers=auth(api, team))
    assert r.json()["state"] == "succeeded"
    with api.service.sessions.begin() as s:
        row = s.get(JobRow, job["id"])
        s.execute(update(JobRow).where(JobRow.id == job["id"]).values(
            admitted_at=row.finished_at - timedelta(hours=hours)))
    return job["id"]


def test_the_slowdown_is_learned_from_ended_jobs_and_planned_with(api):
    view = api.get("/api/v1/slowdown", headers=auth(api, "nlp")).json()
    assert view["default"] == [1.0, 1.1, 1.3] and view["classes"] == []
    # one host: as long as planned; two hosts under one switch: half as long again
    for i in range(8):
        run_to_end(api, "vision", spec(f"one-{i}", 8), 1.0)
        run_to_end(api, "vision", spec(f"two-{i}", 16), 1.5)
    view = api.get("/api/v1/slowdown", headers=auth(api, "nlp")).json()
    [learned] = view["classes"]
    assert learned["job_class"] is None
    one, switch, across = learned["tiers"]
    assert (one["samples"], switch["samples"], across["samples"]) == (8, 8, 0)
    # eight samples against the policy's 1.1 worth eight: halfway in log terms
    assert switch["factor"] == pytest.approx((1.1 * 1.5) ** 0.5, abs=0.01)
    assert across["factor"] == max(1.3, switch["factor"])
    # a pass plans with it: the next two-host job is expected to hold both hosts longer
    big = submit(api, "vision", spec("big", 16)).json()
    assert api.tick() == [big["id"]]
    waiting = submit(api, "nlp", spec("next", 8)).json()
    assert api.tick() == []
    why = api.get(f"/api/v1/jobs/{waiting['id']}/explain", headers=auth(api, "nlp")).json()
    assert why["eta_seconds"] == pytest.approx(HOUR * switch["factor"], abs=30)
    # the spread jobs' longer runs taught the slowdown, not vision's estimates: its one-host
    # jobs ran as declared
    assert view["correct_estimates"] == "up"
    assert view["estimates"] == [{"team": "vision", "source": "estimate", "samples": 8,
                                  "factor": 1.0}]


def test_a_team_that_runs_longer_than_it_declares_is_planned_longer(api):
    for i in range(6):         # nlp's one-host jobs say 1h and run 3h
        run_to_end(api, "nlp", spec(f"long-{i}", 8), 3.0)
    [nlp] = api.get("/api/v1/slowdown", headers=auth(api, "nlp")).json()["estimates"]
    assert (nlp["team"], nlp["samples"]) == ("nlp", 6) and nlp["factor"] > 1.5
    # its next job holds both hosts; a vision job waits for as long as nlp really runs
    big = submit(api, "nlp", spec("big", 16)).json()
    assert api.tick() == [big["id"]]
    waiting = submit(api, "vision", spec("next", 8)).json()
    assert api.tick() == []
    why = api.get(f"/api/v1/jobs/{waiting['id']}/explain", headers=auth(api, "vision")).json()
    assert why["eta_seconds"] == pytest.approx(HOUR * 1.1 * nlp["factor"], abs=30)


def test_learning_can_be_turned_off(api):
    policy = api.service.settings.policy
    api.service.settings.policy = policy.model_copy(update={"learn_slowdown": False})
    api.service._policy_cache = None
    for i in range(3):
        run_to_end(api, "vision", spec(f"two-{i}", 16), 3.0)
    view = api.get("/api/v1/slowdown", headers=auth(api, "nlp")).json()
    assert view["learn"] is False and view["classes"] == []
