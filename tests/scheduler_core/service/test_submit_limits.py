"""Limits on the jobs a team and a user may have submitted and not ended (policy
`max_submit_jobs`, `user_max_submit_jobs`: Slurm's MaxSubmitJobs), through the real app
on SQLite and PostgreSQL: single submits, an array, a batch, a retry with its key, ended
jobs making room, the limits in `share`."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import serve
from tests.helpers import until

POLICY = PolicyConfig.model_validate({
    "user_max_submit_jobs": 3,
    "teams": {"vision": {"max_submit_jobs": 6, "users": {"carol": {"max_submit_jobs": 5}}}}})


@pytest.fixture
def api(db_url):
    for client in serve(db_url, policy=POLICY):
        for team, user in (("vision", "alice"), ("vision", "bob"), ("vision", "carol")):
            client.tokens[user] = create_token(client.service.sessions, team, user=user)
        yield client


def post(api, who: str, spec: dict, key: str | None = None):
    return api.post("/api/v1/jobs", headers={"Authorization": f"Bearer {api.tokens[who]}"},
                    json={"spec": {"roles": [{"name": "w", "gpus": 1}],
                                   "expected_runtime": "1h", **spec},
                          **({"idempotency_key": key} if key else {})})


def stored(api, **where) -> int:
    with api.service.sessions() as s:
        return s.scalar(select(func.count()).select_from(JobRow).filter_by(**where))


def test_a_user_and_a_team_are_held_to_their_limits_and_told_which(api):
    for i in range(3):
        assert post(api, "alice", {"name": f"a{i}"}, key=f"a{i}").status_code == 201
    r = post(api, "alice", {"name": "a3"})
    assert r.status_code == 422
    said = r.json()["detail"]
    assert "user_max_submit_jobs" in said and "'alice'" in said and "limit of 3" in said
    assert "cancel --user alice" in said
    # a retry of a stored job is never refused: it is the same job
    again = post(api, "alice", {"name": "a0"}, key="a0")
    assert again.status_code == 200
    # an array counts each element: four are too many for bob, and none is stored
    r = post(api, "bob", {"name": "sweep", "array": "0-3"})
    assert r.status_code == 422 and "4 more" in r.json()["detail"], r.text
    assert stored(api, user="bob") == 0
    assert post(api, "bob", {"name": "sweep", "array": "0-2"}).status_code == 201
    # the team has 6 open now: the team's token (no user) and carol (5 of her own) wait
    r = post(api, "admin", {"name": "t", "team": "vision"})
    assert r.status_code == 422
    assert "max_submit_jobs: team 'vision' has 6 jobs" in r.json()["detail"]
    assert post(api, "carol", {"name": "c0"}).status_code == 422
    # a batch is one ask: refused whole; another team's goes in (its own limits)
    for team, code in (("vision", 422), ("nlp", 201)):
        r = api.post("/api/v1/jobs/batch",
                     headers={"Authorization": f"Bearer {api.tokens[team]}"},
                     json={"jobs": [{"spec": {"name": f"{team}{i}", "expected_runtime": "1h",
                                              "roles": [{"name": "w", "gpus": 1}]}}
                                    for i in range(2)]})
        assert r.status_code == code, r.text
    assert stored(api, team="vision") == 6
    # jobs that end make room
    r = api.post("/api/v1/jobs/cancel", headers={"Authorization": f"Bearer {api.tokens['alice']}"},
                 json={"user": "alice", "state": "pending"})
    assert len(r.json()["cancelled"]) == 3
    until(lambda: post(api, "carol", {"name": "c1"}).status_code == 201,
          "carol submits once alice's jobs are cancelled", timeout=5)


def test_share_shows_each_limit(api):
    post(api, "alice", {"name": "a"})
    teams = {t["name"]: t for t in api.get(
        "/api/v1/shares", headers={"Authorization": f"Bearer {api.tokens['vision']}"}).json()}
    vision = teams["vision"]
    assert vision["max_submit_jobs"] == 6
    users = {u["user"]: u for u in vision["users"]}
    assert users["alice"]["max_submit_jobs"] == 3 and users["alice"]["pending_jobs"] == 1
