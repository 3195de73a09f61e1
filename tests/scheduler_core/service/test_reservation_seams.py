"""Where team reservations meet time limits and quotas, through the real app on SQLite
and PostgreSQL: deleting (or moving) a reservation moves the stop it gave its running
jobs; an update may not take a job past its reservation's end; a reservation's jobs
count against no quota (held, borrowed, the quota check and its ETA); a full
reservation says who holds it; a job longer than its reservation is refused at submit,
in a batch and by `plan`."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import update

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.planner import plan
from airflow_gpu.scheduler_core.policy.windows import Window
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import serve
from tests.helpers import make_cluster

HOSTS = ({"name": "dgx-[1-4]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def spec(name: str, gpus: int = 8, runtime: str | None = "1h", **more) -> dict:
    roles = [{"name": "w", "replicas": max(1, gpus // 8), "gpus": min(gpus, 8)}]
    return {"name": name, "roles": roles,
            **({"expected_runtime": runtime} if runtime else {}), **more}


def post(api, team: str, body: dict):
    return api.post("/api/v1/jobs", headers=auth(api, team), json={"spec": body})


def submit(api, team: str, body: dict) -> dict:
    r = post(api, team, body)
    assert r.status_code == 201, r.text
    return r.json()


def job(api, job_id: str) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}", headers=auth(api, "admin")).json()


def reserve(api, **body) -> dict:
    r = api.post("/api/v1/reservations", headers=auth(api, "admin"),
                 json={"start": "now", "teams": ["vision"], **body})
    assert r.status_code == 201, r.text
    return r.json()


def events(api, job_id: str) -> list[str]:
    return [e["message"] for e in api.get(f"/api/v1/jobs/{job_id}/explain",
                                          headers=auth(api, "admin")).json()["events"]]


def back_in_time(api, job_id: str, seconds: float) -> None:
    """As if the job had been admitted `seconds` earlier (its stop moves with it)."""
    got = job(api, job_id)
    by = timedelta(seconds=seconds)
    with api.service.sessions.begin() as s:
        row = s.get(JobRow, job_id)
        s.execute(update(JobRow).where(JobRow.id == job_id).values(
            admitted_at=row.admitted_at - by,
            deadline_at=None if got["deadline_at"] is None else row.deadline_at - by))


@pytest.fixture
def api(db_url):
    """Jobs that set no time limit get 6 hours (the policy's default)."""
    yield from serve(db_url, PolicyConfig(default_time_limit=6 * 3600), hosts=HOSTS)


# -- 4: deleting or moving a reservation moves its jobs' stop -----------------------------
def test_deleting_a_team_reservation_lifts_the_stop_it_gave_its_running_jobs(api):
    reserve(api, name="vis", hosts="dgx-1", duration="2h")
    j = submit(api, "vision", spec("in", reservation="vis"))
    api.tick()
    got = job(api, j["id"])
    assert got["state"] == "admitted" and 7100 <= got["time_limit_s"] <= 7200, got
    assert api.delete("/api/v1/reservations/vis", headers=auth(api, "admin")).status_code == 200
    got = job(api, j["id"])
    assert got["time_limit_s"] == 6 * 3600, got        # its own (the policy's), not 119
    assert any("reservation 'vis' was deleted: its end no longer stops this job" in m
               and "(its own time limit, 6h)" in m for m in events(api, j["id"]))
    # three hours on, past the old end (and its grace): it still runs, not `timeout`
    back_in_time(api, j["id"], 3 * 3600)
    assert api.app.state.loop.check_leases() == []
    assert job(api, j["id"])["state"] == "admitted"


def test_a_moved_reservation_moves_its_jobs_stop_with_its_end(api):
    reserve(api, name="vis", hosts="dgx-1", duration="2h")
    j = submit(api, "vision", spec("in", runtime="30m", reservation="vis"))
    api.tick()
    r = api.patch("/api/v1/reservations/vis", headers=auth(api, "admin"),
                  json={"duration": "1h"})
    assert r.status_code == 200, r.text
    assert 3500 <= job(api, j["id"])["time_limit_s"] <= 3600       # shortened: its end
    api.patch("/api/v1/reservations/vis", headers=auth(api, "admin"), json={"duration": "9h"})
    assert job(api, j["id"])["time_limit_s"] == 6 * 3600           # never past its own
    assert any("reservation 'vis' was changed: it is stopped at" in m
               for m in events(api, j["id"]))


# -- 5: an update may not take a job past its reservation's end ----------------------------
def test_a_time_limit_past_the_reservations_end_is_refused_naming_it(api):
    made = reserve(api, name="vis", hosts="dgx-1", duration="2h")
    j = submit(api, "vision", spec("in", reservation="vis"))
    api.tick()
    r = api.patch(f"/api/v1/jobs/{j['id']}", headers=auth(api, "admin"),
                  json={"time_limit": "10h"})
    assert r.status_code == 422, r.text
    said = r.json()["detail"]
    assert said.startswith("time_limit: 10h would run job ") and "reservation 'vis'" in said
    assert made["end"] in said and re.search(r"of at most (2h|1h59m),", said), said
    assert "reserve update vis --end" in said
    assert 7100 <= job(api, j["id"])["time_limit_s"] <= 7200      # unchanged
    r = api.patch(f"/api/v1/jobs/{j['id']}", headers=auth(api, "admin"),
                  json={"time_limit": "90m"})
    assert r.status_code == 200 and r.json()["time_limit_s"] == 5400, r.text

    # a pending job of a reservation that starts later: from its start
    later = reserve(api, name="later", hosts="dgx-2", start="now+1h", duration="2h")
    p = submit(api, "vision", spec("p", reservation="later"))
    r = api.patch(f"/api/v1/jobs/{p['id']}", headers=auth(api, "admin"),
                  json={"time_limit": "3h"})
    assert r.status_code == 422 and "time_limit: 3h would end after its reservation " \
        f"'later' does ({later['end']}, 2h after its start)" in r.json()["detail"], r.text
    assert api.patch(f"/api/v1/jobs/{p['id']}", headers=auth(api, "admin"),
                     json={"time_limit": "2h"}).status_code == 200


# -- 6: a reservation's jobs count against no quota ---------------------------------------
def test_a_reservations_jobs_count_against_no_quota(api):
    r = api.put("/api/v1/teams/vision", headers=auth(api, "admin"),
                json={"quota_gpus": 8, "borrow_gpus": 0})
    assert r.status_code == 200, r.text
    reserve(api, name="vis", hosts="dgx-[1-2]", duration="4h")
    inside = submit(api, "vision", spec("inside", 16, "1h", reservation="vis"))  # > quota
    outside = submit(api, "vision", spec("outside", 8, "3h"))
    api.tick()
    assert job(api, inside["id"])["state"] == job(api, outside["id"])["state"] == "admitted"
    teams = {t["name"]: t for t in api.get("/api/v1/teams",
                                           headers=auth(api, "vision")).json()}
    v = teams["vision"]
    assert (v["held_gpus"], v["borrowed_gpus"], v["reservation_gpus"]) == (8, 0, 16), v
    # the team's next job waits for its quota: freed when `outside` ends, not `inside`
    waits = submit(api, "vision", spec("waits", 8, "1h"))
    api.tick()
    why = job(api, waits["id"])["pending"]
    assert why["code"] == "Quota", why
    assert why["details"]["quota_frees_with"] == outside["id"], why
    assert f"when job outside ({outside['id'][:8]}) ends" in why["reason"], why


# -- 7: a full reservation says who holds it; a job longer than it is refused --------------
def test_a_full_reservation_says_who_holds_it(api):
    reserve(api, name="vis", hosts="dgx-1", duration="2h")
    first = submit(api, "vision", spec("first", 8, "30m", reservation="vis"))
    second = submit(api, "vision", spec("second", 8, "30m", reservation="vis"))
    api.tick()
    assert job(api, first["id"])["state"] == "admitted"
    why = job(api, second["id"])["pending"]
    assert why["code"] == "Reservation" and "would end after" not in why["reason"], why
    assert (f"its reservation 'vis' (dgx-1) is full: held by first ({first['id'][:8]}) (8)"
            in why["reason"]), why
    assert why["details"]["held_by"] == {first["id"]: 8}


@pytest.mark.parametrize("body, says", [
    (spec("long", runtime="3h", reservation="vis"),
     "expected_runtime: 3h would end after its reservation 'vis' does ({end}, 2h after its "
     "start); a job in a reservation must end inside it: give an expected_runtime of at "
     "most 2h"),
    (spec("limit", runtime="1h", time_limit="5h", reservation="vis"),
     "time_limit: 5h would end after its reservation 'vis' does ({end}, 2h after its start)"
     "; a job in a reservation must end inside it: give a time_limit of at most 2h"),
    (spec("bare", runtime=None, time_limit="3h", reservation="vis"),
     "time_limit: 3h would end after"),
])
def test_a_job_longer_than_its_reservation_is_refused_at_submit(api, body, says):
    made = reserve(api, name="vis", hosts="dgx-1", start="now+1h", duration="2h")
    r = post(api, "vision", body)
    assert r.status_code == 422, r.text
    assert says.format(end=made["end"]) in r.json()["detail"], r.text
    assert "airflow-gpu reserve update vis --end" in r.json()["detail"]
    # the same job in a batch: refused, naming it, and nothing is queued
    r = api.post("/api/v1/jobs/batch", headers=auth(api, "vision"), json={"jobs": [
        {"spec": spec("fine", reservation="vis")}, {"spec": body}]})
    assert r.status_code == 422 and "jobs[1]" in r.text and "would end after" in r.text, r.text
    assert api.get("/api/v1/jobs", headers=auth(api, "vision")).json() == []


def test_the_policys_default_runtime_is_named_when_the_job_gives_none(api):
    reserve(api, name="short", hosts="dgx-1", duration="30m")
    r = post(api, "vision", spec("bare", runtime=None, reservation="short"))
    assert r.status_code == 422, r.text
    assert ("expected_runtime: not given (the policy's default_runtime, 1h) would end after "
            "its reservation 'short'") in r.json()["detail"]
    assert post(api, "vision", spec("ok", runtime="20m", reservation="short")).status_code == 201


def test_plan_refuses_a_job_longer_than_its_reservation_and_plans_the_others():
    w = Window("vis", ("dgx-1",), 0.0, 7200.0, frozenset({"vision"}))
    jobs = [JobSpec.model_validate({**spec(n, runtime=rt, reservation="vis"),
                                    "team": "vision"}) for n, rt in (("long", "3h"),
                                                                     ("fits", "1h"))]
    got = plan(ClusterState(make_cluster(*HOSTS)), jobs, windows=[w])
    assert [(j.name, why.split(";")[0]) for j, why in got.rejected] == [
        ("long", "expected_runtime: 3h would end after its reservation 'vis' does (in 2h)")]
    assert [j.name for j, _ in got.admitted] == ["fits"]
