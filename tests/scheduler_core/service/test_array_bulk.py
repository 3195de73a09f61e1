"""An array named to hold, release and update acts on each of its elements, one UPDATE for
them all (Slurm's `scontrol hold <array id>`, `ArrayTaskThrottle`), through the real app
and store (SQLite and PostgreSQL), within who may change which job; a reservation names
the elements it will stop as queue does (`sweep_0`); a cancelled job at the head of a
chain of 300 dependent jobs takes the whole chain with it in one pass, two reads per
level; messages name jobs by their 8-character id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from airflow_gpu.cli.commands.reserve_command import made_line
from airflow_gpu.scheduler_core.service.auth import create_token
from tests.databases import serve
from tests.scheduler_core.service.test_report_statements import Statements

CHAIN = 300


@pytest.fixture
def api(db_url):
    for client in serve(db_url):
        for user in ("alice", "bob"):
            client.tokens[user] = create_token(client.service.sessions, "vision", user=user)
        yield client


def auth(api, who: str = "vision") -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def spec(name: str, gpus: int = 1, **more) -> dict:
    return {"name": name, "roles": [{"name": "w", "gpus": gpus}], "expected_runtime": "1h",
            **more}


def submit(api, body: dict, who: str = "vision") -> dict:
    r = api.post("/api/v1/jobs", json={"spec": body}, headers=auth(api, who))
    assert r.status_code == 201, r.text
    return r.json()


def act(api, verb: str, who: str = "vision", status: int = 200, **body) -> dict:
    r = api.post(f"/api/v1/jobs/{verb}", json=body, headers=auth(api, who))
    assert r.status_code == status, r.text
    return r.json()


def elements(api, name: str) -> dict[int, dict]:
    r = api.get(f"/api/v1/jobs?name={name}", headers=auth(api))
    assert r.status_code == 200, r.text
    return {j["array_index"]: j for j in r.json()}


def codes(api, name: str) -> dict[int, str | None]:
    return {i: j["state"] if j["state"] != "pending" else j["pending"]["code"]
            for i, j in elements(api, name).items()}


def job_updates(seen: list[str]) -> list[str]:
    return [q for q in seen if q.startswith("UPDATE jobs ")]


def test_hold_release_and_update_of_an_array_change_each_element_in_one_update(api):
    submit(api, spec("sweep", array="0-5%2"))
    assert len(api.tick()) == 2
    with Statements(api.service.engine) as st:
        got = act(api, "hold", jobs=["sweep"])
    # the four pending elements are held, the two admitted ones passed over
    assert (got["count"], len(got["changed"]), got["one_job"]) == (6, 4, False)
    assert len(job_updates(st.seen)) == 1, job_updates(st.seen)
    assert codes(api, "sweep") == {0: "admitted", 1: "admitted", **dict.fromkeys(
        range(2, 6), "JobHeldUser")}
    reason = elements(api, "sweep")[3]["pending"]["reason"]
    assert "airflow-gpu release" in reason and "its array sweep" in reason
    first = elements(api, "sweep")[0]
    r = api.post(f"/api/v1/jobs/{first['id']}/finish", headers=auth(api),
                 json={"outcome": "succeeded", "attempt": first["attempt"]})
    assert r.status_code == 200, r.text
    assert api.tick() == []     # the freed turn went to element 2, which is held
    with Statements(api.service.engine) as st:
        got = act(api, "release", jobs=["sweep"])
    assert len(got["changed"]) == 4
    # each back to what it waited for: one UPDATE per kind (its turn, or none)
    assert len(job_updates(st.seen)) == 2, job_updates(st.seen)
    assert codes(api, "sweep") == {0: "succeeded", 1: "admitted", 2: None, **dict.fromkeys(
        range(3, 6), "JobArrayTaskLimit")}
    assert len(api.tick()) == 1
    # priority for the pending elements, a time limit for the pending and live ones
    with Statements(api.service.engine) as st:
        got = act(api, "update", jobs=["sweep"], priority=7, time_limit="30m")
    assert len(job_updates(st.seen)) <= 3, job_updates(st.seen)   # pending; live by pass
    now = elements(api, "sweep")
    assert {i: j["priority"] for i, j in now.items() if j["state"] == "pending"} == {
        3: 7, 4: 7, 5: 7}
    assert {j["time_limit_s"] for j in now.values() if j["state"] == "admitted"} == {1800}
    assert {j["spec"]["time_limit"] for j in now.values() if j["state"] != "succeeded"} == {
        "30m"}
    assert len(got["changed"]) == 5
    events = api.get("/api/v1/jobs/sweep_4/explain", headers=auth(api)).json()["events"]
    assert [e["kind"] for e in events].count("held") == 1
    assert events[-1]["message"].endswith("priority 0 -> 7, time limit none -> 30m")


def test_the_throttle_of_an_array_lets_in_more_or_sends_pending_ones_back(api):
    submit(api, spec("sweep", array="0-5%2"))
    assert len(api.tick()) == 2
    got = act(api, "update", jobs=["sweep"], max_running=4)
    assert got["arrays"][0]["max_running"] == 4
    assert "runs at most 4 of its 6" in elements(api, "sweep")[5]["pending"]["reason"]
    assert len(api.tick()) == 2           # two more turns
    assert [c for c in codes(api, "sweep").values()].count("admitted") == 4
    # no limit: every element gets a turn at the next pass
    act(api, "update", jobs=["sweep"], max_running=0)
    assert len(api.tick()) == 2
    # lowered: the live ones run on; the pending ones over it wait for a turn again
    submit(api, spec("wide", 8, array="0-9"))
    for i in elements(api, "sweep").values():
        api.post(f"/api/v1/jobs/{i['id']}/finish", headers=auth(api),
                 json={"outcome": "succeeded", "attempt": i["attempt"]})
    assert len(api.tick()) == 2           # two 8-GPU elements fit, eight wait
    assert list(codes(api, "wide").values()).count("Resources") == 8
    with Statements(api.service.engine) as st:
        act(api, "update", jobs=["wide"], max_running=3)
    assert len(job_updates(st.seen)) == 2, job_updates(st.seen)
    now = codes(api, "wide")
    assert [now[i] for i in range(10)] == ["admitted"] * 2 + ["Resources"] + [
        "JobArrayTaskLimit"] * 7
    assert "max_running 3" in elements(api, "wide")[9]["pending"]["reason"]


def test_an_array_is_held_only_when_every_element_is_the_caller_s(api):
    submit(api, spec("mine", array="0-2"), who="alice")
    # bob's token changes only bob's jobs: nothing of alice's array is held
    got = act(api, "hold", who="bob", status=403, jobs=["mine"])
    assert "belongs to user 'alice'" in got["detail"] and "nothing was held" in got["detail"]
    assert set(codes(api, "mine").values()) == {None}
    # the team's token (its service account) and an admin may; an admin's hold stays
    act(api, "hold", who="admin", jobs=["mine"])
    assert set(codes(api, "mine").values()) == {"JobHeldAdmin"}
    got = act(api, "release", who="alice", status=403, jobs=["mine"])
    assert "JobHeldAdmin" in got["detail"] and "nothing was released" in got["detail"]
    assert set(codes(api, "mine").values()) == {"JobHeldAdmin"}
    act(api, "release", who="admin", jobs=["mine"])
    act(api, "hold", who="alice", jobs=["mine"])
    assert set(codes(api, "mine").values()) == {"JobHeldUser"}
    act(api, "release", who="vision", jobs=["mine"])
    assert set(codes(api, "mine").values()) == {None}
    got = act(api, "update", who="bob", status=403, jobs=["mine"], max_running=1)
    assert "nothing was updated" in got["detail"]


def test_one_job_named_keeps_the_one_job_answers_with_short_ids(api):
    job = submit(api, spec("solo"))
    assert api.tick() == [job["id"]]
    got = act(api, "hold", status=409, jobs=["solo"])
    assert f"job {job['id'][:8]} (solo) is admitted" in got["detail"]
    assert job["id"] not in got["detail"]             # 8-character ids, as elsewhere
    got = act(api, "update", status=422, jobs=["solo"], max_running=2)
    assert "max_running: 'solo' names one job" in got["detail"]
    got = act(api, "update", jobs=["solo"], time_limit="20m")
    assert got["one_job"] and got["jobs"][0]["time_limit_s"] == 1200
    assert got["jobs"][0]["replicas"]                   # a live job's grant, as GET shows
    got = act(api, "update", status=409, jobs=["solo"], priority=3)
    assert f"job {job['id'][:8]} (solo) is admitted" in got["detail"]


def test_bad_input_is_one_message_naming_the_field_and_changes_nothing(api):
    submit(api, spec("sweep", array="0-3%2"))
    for body, says in (({"max_running": -1}, "max_running: -1 is out of range"),
                       ({"max_running": 10**9}, "max_running: 1000000000 is out of range"),
                       ({"max_running": True}, "true is not a whole number"),
                       ({"time_limit": "abc"}, "time_limit: 'abc' is not a duration"),
                       ({}, "update: give --priority, --time-limit and/or --max-running")):
        got = act(api, "update", status=422, jobs=["sweep"], **body)
        assert says in str(got["detail"]), got
    act(api, "hold", status=422, jobs=[])
    assert "does not exist" in act(api, "hold", status=404, jobs=["nope"])["detail"]
    # the same array twice is changed once
    act(api, "update", jobs=["sweep", "sweep"], max_running=1)
    events = api.get("/api/v1/jobs/sweep_3/explain", headers=auth(api)).json()["events"]
    assert [e["kind"] for e in events].count("updated") == 1
    assert codes(api, "sweep") == {i: "JobArrayTaskLimit" for i in range(1, 4)} | {0: None}


def test_a_reservation_names_the_elements_it_will_stop_as_queue_does(api):
    submit(api, spec("sweep", 8, array="0-1"))
    assert len(api.tick()) == 2
    start = (datetime.now(UTC) + timedelta(minutes=30)).isoformat()
    r = api.post("/api/v1/reservations", headers=auth(api, "admin"), json={
        "name": "fw", "hosts": "dgx-1", "start": start, "duration": 3600, "maint": True})
    assert r.status_code in (200, 201), r.text
    (stop,) = r.json()["stops"]
    assert stop["array_index"] in (0, 1)
    assert f"{stop['id'][:8]}  sweep_{stop['array_index']}  team vision" in made_line(
        r.json())


def chain(api, n: int) -> list[str]:
    r = api.post("/api/v1/jobs/batch", headers=auth(api), json={"jobs": [
        {"spec": spec(f"c{i}", **({"depends_on": f"afterok:c{i - 1}"} if i else {}))}
        for i in range(n)]})
    assert r.status_code == 201, r.text
    return [j["id"] for j in r.json()]


def test_cancelling_the_head_of_a_chain_cancels_it_whole_in_one_pass(api):
    ids = chain(api, CHAIN)
    # an array and a job further down: afterok on it, on one element, and afterany
    r = api.post("/api/v1/jobs/batch", headers=auth(api), json={"jobs": [
        {"spec": spec("sweep", array="0-2", depends_on=f"afterok:c{CHAIN - 1}")},
        {"spec": spec("report", depends_on="afterok:sweep")},
        {"spec": spec("one", depends_on="afterok:sweep_1")},
        {"spec": spec("anyway", depends_on="afterany:sweep")}]})
    assert r.status_code == 201, r.text
    api.tick()                            # the head runs, the others' reasons are written
    r = api.post("/api/v1/jobs/cancel", headers=auth(api), json={"jobs": ["c0"]})
    assert r.json()["cancelled"] == [ids[0]]
    with Statements(api.service.engine) as st:
        api.tick()
    # two short reads per level of the chain (events aside: SQLite's driver inserts the
    # ORM's rows one by one), not several statements per job and a pass per ten levels
    seen = [q for q in st.seen if not q.startswith("INSERT INTO events")]
    assert len(seen) <= 2 * CHAIN + 80, len(seen)
    got = api.get("/api/v1/jobs?state=cancelled&limit=1000", headers=auth(api)).json()
    by_name = {(j["name"], j["array_index"]): j for j in got}
    assert len(by_name) == CHAIN + 5
    last = by_name[(f"c{CHAIN - 1}", None)]
    assert last["pending"] is None or last["pending"]["code"] == "DependencyNeverSatisfied"
    why = api.get(f"/api/v1/jobs/{last['id']}/explain", headers=auth(api)).json()
    assert why["reason"] == (f"c{CHAIN - 2} ({ids[CHAIN - 2][:8]}) ended cancelled, but "
                             "this job waited for it to succeed (afterok): it can never "
                             "start, so it was cancelled")
    assert why["events"][-1]["message"] == why["reason"]
    report = api.get("/api/v1/jobs/report/explain", headers=auth(api)).json()
    assert report["reason"].startswith("array sweep (") and "(its element " in report[
        "reason"]
    # afterany on the cancelled array holds: that job is let in
    assert api.get("/api/v1/jobs/anyway", headers=auth(api)).json()["state"] == "admitted"
