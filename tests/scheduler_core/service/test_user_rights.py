"""Who may change a job, route by route through the real app on SQLite and PostgreSQL
(docs/service.md, "Who may change a job"; service/rights.py): a user's token changes only
that user's jobs; the team's token (no user, its service account) and an admin's change
all of the team's; reads stay team-wide. Each write route refuses another user's job (403
naming the job, its owner, the token's user and what to do, the job unchanged) and
allows the owner's token, the team's and an admin's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.common import Principal
from airflow_gpu.scheduler_core.service.rights import refusal
from tests.databases import serve

ALLOWED = ("alice", "vision", "admin")       # the owner, the team's token, an admin


@pytest.fixture
def api(db_url):
    for client in serve(db_url):
        for user in ("alice", "bob"):
            client.tokens[user] = create_token(client.service.sessions, "vision", user=user)
        yield client


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submit(api, who: str = "alice", name: str = "train", **more) -> str:
    r = api.post("/api/v1/jobs", headers=auth(api, who), json={"spec": {
        "name": name, "roles": [{"name": "w", "gpus": 1}], "expected_runtime": "1h",
        **more}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job(api, job_id: str) -> dict:
    r = api.get(f"/api/v1/jobs/{job_id}", headers=auth(api, "admin"))
    assert r.status_code == 200, r.text
    return r.json()


# -- the jobs each route acts on, as alice's token leaves them --------------------------
def pending(api) -> str:
    return submit(api)


def held(api) -> str:
    job_id = submit(api)
    r = api.post(f"/api/v1/jobs/{job_id}/hold", headers=auth(api, "alice"))
    assert r.status_code == 200, r.text
    return job_id


def admitted(api) -> str:
    job_id = submit(api)
    assert job_id in api.tick()
    return job_id


def running(api) -> str:
    job_id = admitted(api)
    r = api.post(f"/api/v1/jobs/{job_id}/heartbeat", headers=auth(api, "alice"))
    assert r.json()["state"] == "running", r.text
    return job_id


@dataclass
class Route:
    name: str
    ready: Callable            # makes alice's job in the state the route acts on
    method: str
    path: str                  # {id}: the job's id
    body: dict | None
    done: Callable[[dict], bool]     # the job as the route leaves it

    def call(self, api, who: str, job_id: str):
        kw = {"json": self.body} if self.body is not None else {}
        if self.path == "/api/v1/jobs/cancel":
            kw = {"json": {"jobs": [job_id]}}
        return api.request(self.method, self.path.format(id=job_id),
                           headers=auth(api, who), **kw)


ROUTES = [
    Route("cancel", pending, "DELETE", "/api/v1/jobs/{id}", None,
          lambda j: j["state"] == "cancelled"),
    Route("bulk cancel", pending, "POST", "/api/v1/jobs/cancel", None,
          lambda j: j["state"] == "cancelled"),
    Route("hold", pending, "POST", "/api/v1/jobs/{id}/hold", None,
          lambda j: j["pending"]["code"] in ("JobHeldUser", "JobHeldAdmin")),
    Route("release", held, "POST", "/api/v1/jobs/{id}/release", None,
          lambda j: j["state"] == "pending" and (j["pending"] or {}).get("code") not in (
              "JobHeldUser", "JobHeldAdmin")),
    Route("update", pending, "PATCH", "/api/v1/jobs/{id}", {"priority": 5},
          lambda j: j["priority"] == 5),
    Route("requeue", running, "POST", "/api/v1/jobs/{id}/requeue", None,
          lambda j: j["state"] == "preempting"),
    Route("heartbeat", admitted, "POST", "/api/v1/jobs/{id}/heartbeat", None,
          lambda j: j["state"] == "running"),
    Route("finish", running, "POST", "/api/v1/jobs/{id}/finish",
          {"outcome": "succeeded", "exit_code": 0}, lambda j: j["state"] == "succeeded"),
]


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_each_write_route_refuses_another_users_job_and_allows_the_owner_team_and_admin(
        api, route):
    first = route.ready(api)
    before = job(api, first)
    assert not route.done(before)
    for who in ("bob", "nlp"):                 # another user of the team; another team
        r = route.call(api, who, first)
        assert r.status_code == 403, (who, r.text)
        said = r.json()["detail"]
        assert first in said and "admin token" in said, said
        if who == "bob":
            assert "belongs to user 'alice'" in said and "for user 'bob'" in said, said
            assert "a token of team 'vision' without --user" in said, said
    after = job(api, first)
    assert (after["state"], after["priority"], after["pending"]) == (
        before["state"], before["priority"], before["pending"])
    for who in ALLOWED:
        job_id = first if who == "alice" else route.ready(api)
        r = route.call(api, who, job_id)
        assert r.status_code == 200, (who, r.text)
        assert route.done(job(api, job_id)), (who, job(api, job_id))


def test_a_users_token_may_not_change_the_teams_own_jobs(api):
    """A job the team's token submitted without a user is the service account's."""
    own = submit(api, "vision")
    r = api.delete(f"/api/v1/jobs/{own}", headers=auth(api, "alice"))
    assert r.status_code == 403
    said = r.json()["detail"]
    assert own in said and "belongs to the team itself" in said and "user 'alice'" in said
    assert job(api, own)["state"] == "pending"
    r = api.post("/api/v1/jobs/cancel", headers=auth(api, "alice"), json={"jobs": [own]})
    assert r.status_code == 403 and "nothing was cancelled" in r.json()["detail"]


def test_a_job_the_team_token_submits_for_a_user_is_that_users_and_the_teams(api):
    """As Airflow's operators submit (the connection's team token naming the DAG run's
    user): the team's token heartbeats and finishes it, the user may cancel it."""
    for_alice = submit(api, "vision", user="alice")
    assert job(api, for_alice)["user"] == "alice"
    assert for_alice in api.tick()
    r = api.post(f"/api/v1/jobs/{for_alice}/heartbeat", headers=auth(api, "vision"))
    assert r.json()["state"] == "running"
    assert api.post(f"/api/v1/jobs/{for_alice}/requeue",
                    headers=auth(api, "bob")).status_code == 403
    r = api.delete(f"/api/v1/jobs/{for_alice}", headers=auth(api, "alice"))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_bulk_cancel_by_a_user_touches_only_that_users_jobs(api):
    hers = [submit(api, "alice", "sweep"), submit(api, "alice", "other")]
    theirs = [submit(api, "bob", "sweep"), submit(api, "vision", "sweep"),
              submit(api, "nlp", "sweep")]
    cancel = "/api/v1/jobs/cancel"
    # by state or name: only alice's, though bob's, the team's and nlp's match too
    shown = api.post(cancel, headers=auth(api, "alice"),
                     json={"state": "pending", "dry_run": True}).json()
    assert sorted(shown["matched"]) == sorted(hers)
    got = api.post(cancel, headers=auth(api, "alice"), json={"name": "sweep"}).json()
    assert got["cancelled"] == [hers[0]]
    # another user named: 403, saying what to do; nothing cancelled
    r = api.post(cancel, headers=auth(api, "alice"), json={"user": "bob"})
    assert r.status_code == 403
    said = r.json()["detail"]
    assert said.startswith("user: ") and "'bob'" in said and "'alice'" in said
    assert "admin token" in said
    # a reference among several that is another user's refuses the whole request
    r = api.post(cancel, headers=auth(api, "alice"), json={"jobs": [hers[1], theirs[0]]})
    assert r.status_code == 403 and theirs[0] in r.json()["detail"]
    assert {job(api, i)["state"] for i in (hers[1], *theirs)} == {"pending"}
    # the team's token matches every user's of the team, never another team's
    got = api.post(cancel, headers=auth(api, "vision"), json={"name": "sweep"}).json()
    assert sorted(got["cancelled"]) == sorted(theirs[:2])
    events = api.get(f"/api/v1/jobs/{hers[0]}/explain",
                     headers=auth(api, "bob")).json()["events"]
    assert "cancelled by user alice of team vision" in events[-1]["message"]


def test_bulk_cancel_of_an_array_is_refused_whole_for_another_user(api):
    bobs = submit(api, "bob", "grid", array="0-3")
    hers = submit(api, "alice", "mine", array="0-1")
    bob_array, her_array = job(api, bobs)["array_id"], job(api, hers)["array_id"]
    cancel = "/api/v1/jobs/cancel"
    r = api.post(cancel, headers=auth(api, "alice"), json={"jobs": [bob_array]})
    assert r.status_code == 403 and "user 'bob'" in r.json()["detail"]
    got = api.post(cancel, headers=auth(api, "alice"), json={"jobs": [her_array]}).json()
    assert got["count"] == 2 and len(got["cancelled"]) == 2
    got = api.post(cancel, headers=auth(api, "bob"), json={"jobs": ["grid"]}).json()
    assert got["count"] == 4 and len(got["cancelled"]) == 4


def test_reads_stay_team_wide_and_events_name_the_user(api):
    hers = submit(api)
    for path in (f"/api/v1/jobs/{hers}", f"/api/v1/jobs/{hers}/explain",
                 f"/api/v1/jobs/{hers}/notifications"):
        assert api.get(path, headers=auth(api, "bob")).status_code == 200, path
    queue = api.get("/api/v1/queue", headers=auth(api, "bob")).json()
    assert [j["id"] for j in queue] == [hers]
    api.post(f"/api/v1/jobs/{hers}/hold", headers=auth(api, "alice"))
    why = job(api, hers)["pending"]
    assert why["code"] == "JobHeldUser" and "held by user alice of team vision" in \
        why["reason"]


def test_the_rule_per_token():
    alice = Principal("vision", user="alice")
    team, admin = Principal("vision"), Principal("ops", admin=True)
    assert alice.may_change("vision", "alice")
    assert not alice.may_change("vision", "bob") and not alice.may_change("vision", None)
    assert not alice.may_change("nlp", "alice")
    assert team.may_change("vision", "bob") and team.may_change("vision", None)
    assert not team.may_change("nlp", None)
    assert admin.may_change("nlp", "carol")
    assert refusal(alice, "j1", "vision", "alice") is None
    said = refusal(alice, "j1", "vision", "bob", "train")
    assert said.startswith("job j1 (train) of team 'vision' belongs to user 'bob'; your "
                           "token is for user 'alice'")
    assert "ask bob to" in said and "a token of team 'vision' without --user" in said
