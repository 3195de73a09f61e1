"""Users inside teams through the real app on SQLite and PostgreSQL: tokens for a user of
a team, jobs that carry their user, fair share over the tree (teams by their shares,
users inside their team's part) in `prio` and `share`, `acct --by user` adding up to
`acct --by team`, `queue --user`, events that name the user, a per-user cap."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.common import utcnow
from airflow_gpu.scheduler_core.service.usage import EndedUsage
from airflow_gpu.scheduler_core.store.models import AllocationRow, JobRow
from tests.databases import serve

POLICY = PolicyConfig.model_validate({"fairshare_weight": 100, "age_weight": 0,
                                      "size_weight": 0,
                                      "teams": {"nlp": {"user_quota_gpus": 8}}})


@pytest.fixture
def api(db_url):
    for client in serve(db_url, policy=POLICY):
        for team, user in (("vision", "alice"), ("vision", "bob"), ("nlp", "carol")):
            client.tokens[user] = create_token(client.service.sessions, team, user=user)
        yield client


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submit(api, who: str, name: str, gpus: int, **more) -> dict:
    roles = [{"name": "w", "replicas": gpus // 8, "gpus": 8}] if gpus > 8 else [
        {"name": "w", "gpus": gpus}]
    r = api.post("/api/v1/jobs", headers=auth(api, who), json={"spec": {
        "name": name, "roles": roles, "expected_runtime": "1h", **more}})
    assert r.status_code == 201, r.text
    return r.json()


def ran(api, who: str, name: str, gpus: int, hours: float) -> str:
    """A job of `who` that ran `gpus` GPUs for `hours`, ending an hour ago."""
    job = submit(api, who, name, gpus)
    assert api.tick() == [job["id"]]
    api.post(f"/api/v1/jobs/{job['id']}/heartbeat", headers=auth(api, who))
    r = api.post(f"/api/v1/jobs/{job['id']}/finish", headers=auth(api, who),
                 json={"outcome": "succeeded", "exit_code": 0})
    assert r.json()["state"] == "succeeded"
    end = utcnow() - timedelta(hours=1)
    with api.service.sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == job["id"]).values(
            admitted_at=end - timedelta(hours=hours), started_at=end - timedelta(
                hours=hours), finished_at=end))
        s.execute(update(AllocationRow).where(AllocationRow.job_id == job["id"]).values(
            granted_at=end - timedelta(hours=hours), released_at=end))
    return job["id"]


def test_two_users_of_a_team_and_one_of_another_share_hierarchically(api):
    ran(api, "alice", "alice-old", 16, 3)        # vision used it all: alice most
    ran(api, "bob", "bob-old", 8, 1)
    # their times were moved back: read the ended jobs afresh, as a restarted service does
    api.service.ended_usage = EndedUsage()
    blocker = submit(api, "admin", "blocker", 16, team="ops")
    api.tick()
    ids = {who: submit(api, who, f"{who}-next", 8)["id"] for who in ("alice", "bob",
                                                                       "carol")}
    prio = api.get("/api/v1/priorities", headers=auth(api, "vision")).json()
    rows = {j["name"]: j for j in prio["jobs"]}
    # nlp has used nothing: carol first; then bob, the lighter user of vision, then alice
    assert [j["name"] for j in prio["jobs"]] == ["carol-next", "bob-next", "alice-next"]
    assert rows["carol-next"]["fairshare"] > rows["bob-next"]["fairshare"] \
        > rows["alice-next"]["fairshare"]
    assert (rows["alice-next"]["team"], rows["alice-next"]["user"]) == ("vision", "alice")
    only = api.get("/api/v1/priorities", params={"user": "bob"},
                   headers=auth(api, "vision")).json()["jobs"]
    assert [j["name"] for j in only] == ["bob-next"]

    shares = {t["name"]: t for t in api.get("/api/v1/shares",
                                            headers=auth(api, "nlp")).json()}
    vision = shares["vision"]
    users = {u["user"]: u for u in vision["users"]}
    assert set(users) == {"alice", "bob"}
    # the users split the team's normalized share; their usage adds up to the team's
    assert users["alice"]["share_norm"] + users["bob"]["share_norm"] == pytest.approx(
        vision["share_norm"], abs=1e-5)
    assert users["alice"]["usage_gpu_hours"] + users["bob"]["usage_gpu_hours"] == \
        pytest.approx(vision["usage_gpu_hours"], rel=1e-4)
    assert users["alice"]["usage_gpu_hours"] > users["bob"]["usage_gpu_hours"] > 0
    assert users["bob"]["fairshare_points"] > users["alice"]["fairshare_points"]
    assert shares["nlp"]["fairshare_points"] > vision["fairshare_points"]
    (carol,) = shares["nlp"]["users"]
    assert carol["user"] == "carol" and carol["pending_jobs"] == 1

    # accounting per user adds up to the team's (nothing running: the figures stand)
    api.delete(f"/api/v1/jobs/{blocker['id']}", headers=auth(api, "admin"))
    by_user = api.get("/api/v1/accounting", params={"by": "user"},
                      headers=auth(api, "nlp")).json()["rows"]
    by_team = {r["team"]: r for r in api.get("/api/v1/accounting", params={"by": "team"},
                                             headers=auth(api, "nlp")).json()["rows"]}
    for team, row in by_team.items():
        mine = [r for r in by_user if r["team"] == team]
        assert sum(r["gpu_hours"] for r in mine) == pytest.approx(
            row["gpu_hours"], abs=1e-4 * len(mine)), (team, mine, row)
        assert sum(r["jobs"] for r in mine) == row["jobs"]
    vis = {r["user"]: r for r in by_user if r["team"] == "vision"}
    assert vis["alice"]["gpu_hours"] == pytest.approx(48, rel=1e-3)
    assert vis["bob"]["gpu_hours"] == pytest.approx(8, rel=1e-3)

    # queue --user, events naming the user
    queued = api.get("/api/v1/queue", params={"user": "alice"},
                     headers=auth(api, "nlp")).json()
    assert {j["name"] for j in queued} == {"alice-next"}
    events = api.get(f"/api/v1/jobs/{ids['alice']}/explain",
                     headers=auth(api, "alice")).json()["events"]
    assert events[0]["message"] == "submitted by user alice of team vision"


def test_a_users_token_makes_its_jobs_that_users_and_a_team_token_may_name_one(api):
    mine = submit(api, "alice", "mine", 1, user="bob")      # a user's token: always alice
    assert mine["user"] == "alice" and mine["spec"]["user"] == "alice"
    named = submit(api, "vision", "named", 1, user="dave")  # the team's token names one
    assert named["user"] == "dave"
    plain = submit(api, "vision", "plain", 1)
    assert plain["user"] is None
    tokens = api.get("/api/v1/tokens", headers=auth(api, "admin")).json()
    assert {t["user"] for t in tokens if t["team"] == "vision"} == {"alice", "bob", None}
    r = api.post("/api/v1/tokens", headers=auth(api, "admin"),
                 json={"team": "x", "role": "admin", "user": "eve"})
    assert r.status_code == 422 and "only team tokens are for a user" in r.text


def test_a_user_cap_inside_the_team_holds_back_that_users_next_job(api):
    first = submit(api, "carol", "first", 8)
    second = submit(api, "carol", "second", 8)
    other = submit(api, "nlp", "other", 8, user="dave")
    admitted = set(api.tick())
    assert first["id"] in admitted and other["id"] in admitted
    assert second["id"] not in admitted
    why = api.get(f"/api/v1/jobs/{second['id']}", headers=auth(api, "nlp")).json()["pending"]
    assert why["code"] == "Quota" and "user 'carol' of team 'nlp' holds 8 GPUs" in why["reason"]
