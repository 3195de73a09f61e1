"""Job arrays and dependencies through the real API on SQLite and PostgreSQL: max_running
(JobArrayTaskLimit, then each element let in as another ends), an array cancelled whole
and one element, each dependency kind satisfied and never satisfied, a chain within one
batch, and what a replica of an element is told."""

from __future__ import annotations

from sqlalchemy import func, select

from airflow_gpu.launch.replica import replicas_of
from airflow_gpu.scheduler_core.store.models import DependencyRow, JobRow


def auth(api, who: str = "vision") -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def spec(name: str, gpus: int = 1, **more) -> dict:
    return {"name": name, "roles": [{"name": "w", "gpus": gpus}], "expected_runtime": "1h",
            **more}


def submit(api, body: dict, who: str = "vision", status: int = 201) -> dict:
    r = api.post("/api/v1/jobs", json={"spec": body}, headers=auth(api, who))
    assert r.status_code == status, r.text
    return r.json()


def get(api, path: str, who: str = "vision", status: int = 200):
    r = api.get(path, headers=auth(api, who))
    assert r.status_code == status, r.text
    return r.json()


def finish(api, ref: str, outcome: str = "succeeded", code: int = 0) -> dict:
    r = api.post(f"/api/v1/jobs/{ref}/finish", headers=auth(api),
                 json={"outcome": outcome, "exit_code": code})
    assert r.status_code == 200, r.text
    return r.json()


def cancel(api, who: str = "vision", status: int = 200, **body) -> dict:
    r = api.post("/api/v1/jobs/cancel", json=body, headers=auth(api, who))
    assert r.status_code == status, r.text
    return r.json()


def states(api, name: str) -> dict[int, str]:
    return {j["array_index"]: j["state"] for j in get(api, f"/api/v1/jobs?name={name}")}


def test_at_most_max_running_elements_hold_a_turn_and_the_next_come_in_as_they_end(api):
    first = submit(api, spec("sweep", array="0-5%2"))
    assert first["array_index"] == 0 and first["array_id"]
    admitted = api.tick()
    assert len(admitted) == 2              # 16 GPUs free, but two turns
    assert states(api, "sweep") == {0: "admitted", 1: "admitted", 2: "pending",
                                    3: "pending", 4: "pending", 5: "pending"}
    third = get(api, "/api/v1/jobs/sweep_3")
    assert third["array_index"] == 3 and third["array_id"] == first["array_id"]
    assert third["pending"]["code"] == "JobArrayTaskLimit"
    assert "runs at most 2 of its 6 elements at once (max_running 2)" in \
        third["pending"]["reason"]
    why = get(api, "/api/v1/jobs/sweep_3/explain")
    assert why["code"] == "JobArrayTaskLimit"
    # the pass never sees them: more passes admit nothing
    assert api.tick() == [] and api.tick() == []
    # queue: each live element, then the waiting ones in one entry
    queue = get(api, "/api/v1/queue")
    assert [(j["array_index"], j.get("array_tasks")) for j in queue] == [
        (0, None), (1, None), (2, "2-5%2")]
    assert queue[2]["array_count"] == 4
    # one ends: the next index gets its turn, and the pass that lets it in admits it
    finish(api, "sweep_0")
    assert len(api.tick()) == 1
    assert states(api, "sweep")[2] == "admitted"
    assert [e["kind"] for e in get(api, "/api/v1/jobs/sweep_2/explain")["events"]][-2:] == [
        "array", "admitted"]
    # each replica knows its element
    job = get(api, "/api/v1/jobs/sweep_2")
    env = replicas_of(job)[0].env()
    assert (env["AIRFLOW_GPU_ARRAY_INDEX"], env["AIRFLOW_GPU_ARRAY_ID"]) == (
        "2", first["array_id"])
    # a referenced array is not one job
    assert "is the array" in get(api, "/api/v1/jobs/sweep", status=409)["detail"]
    assert "has no element 9" in get(api, "/api/v1/jobs/sweep_9", status=404)["detail"]


def test_an_array_without_a_limit_and_a_step_range(api):
    submit(api, spec("steps", array={"range": "1-7:2"}))
    assert len(api.tick()) == 4
    assert sorted(states(api, "steps")) == [1, 3, 5, 7]


def test_cancel_one_element_then_the_whole_array_by_name_or_id(api):
    first = submit(api, spec("sweep", array="0-4%2"))
    api.tick()
    got = cancel(api, jobs=["sweep_1"])
    assert len(got["cancelled"]) == 1 and got["jobs"][0]["array_index"] == 1
    api.tick()                             # element 2 gets the turn 1 freed
    assert states(api, "sweep") == {0: "admitted", 1: "cancelled", 2: "admitted",
                                    3: "pending", 4: "pending"}
    shown = cancel(api, jobs=[first["array_id"][:8]], dry_run=True)
    assert shown["count"] == 4 and shown["cancelled"] == []
    assert cancel(api, jobs=["sweep"])["cancelled"] == shown["matched"]
    assert set(states(api, "sweep").values()) == {"cancelled"}
    with api.service.reads() as s:         # what they held is free
        assert s.scalar(select(func.count()).select_from(JobRow).where(
            JobRow.state == "admitted")) == 0
    big = submit(api, spec("big", 8, roles=[{"name": "w", "replicas": 2, "gpus": 8}]))
    assert api.tick() == [big["id"]]


def test_a_hold_on_a_waiting_element_keeps_it_waiting_after_release(api):
    submit(api, spec("sweep", array="0-3%1"))
    api.tick()
    r = api.post("/api/v1/jobs/sweep_2/hold", headers=auth(api))
    assert r.json()["pending"]["code"] == "JobHeldUser"
    r = api.post("/api/v1/jobs/sweep_2/release", headers=auth(api))
    assert r.json()["pending"]["code"] == "JobArrayTaskLimit"
    assert api.tick() == []


def test_each_kind_of_dependency_lets_the_job_in_once_it_holds(api):
    ok = submit(api, spec("ok"))
    submit(api, spec("bad"))
    api.tick()
    waiting = {kind: submit(api, spec(f"on-{kind}", depends_on=f"{kind}:{target}"))
               for kind, target in (("afterok", "ok"), ("afterany", "bad"),
                                    ("afternotok", "bad"))}
    both = submit(api, spec("both", depends_on=[{"afterok": ["ok"]}, {"afterany": "bad"}]))
    assert api.tick() == []
    why = get(api, "/api/v1/jobs/on-afterok/explain")
    assert why["code"] == "Dependency"
    assert why["reason"] == f"waits for ok ({ok['id'][:8]}) to succeed (afterok; it is " \
        "admitted)"
    assert why["blockers"][0]["id"] == ok["id"]
    finish(api, "ok")
    admitted = set(api.tick())
    assert waiting["afterok"]["id"] in admitted and both["id"] not in admitted
    assert "bad" in get(api, "/api/v1/jobs/both")["pending"]["reason"]
    finish(api, "bad", "failed", 3)
    assert set(api.tick()) == {waiting["afterany"]["id"], waiting["afternotok"]["id"],
                               both["id"]}
    with api.service.reads() as s:         # nothing left to evaluate
        assert s.scalar(select(func.count()).select_from(DependencyRow).where(
            DependencyRow.open.is_(True))) == 0


def test_a_dependency_that_can_never_hold_cancels_the_job_naming_why(api):
    ok, bad = submit(api, spec("ok")), submit(api, spec("bad"))
    api.tick()
    on_bad = submit(api, spec("on-bad", depends_on=f"afterok:{bad['id'][:6]}"))
    on_ok = submit(api, spec("on-ok", depends_on="afternotok:ok"))
    next_one = submit(api, spec("next", depends_on="afterany:on-bad"))   # a chain
    api.tick()
    finish(api, "bad", "failed", 3)
    finish(api, "ok")
    api.tick()
    why = get(api, "/api/v1/jobs/on-bad/explain")
    assert (why["state"], why["code"]) == ("cancelled", "DependencyNeverSatisfied")
    assert why["reason"].startswith(f"bad ({bad['id'][:8]}) ended failed (exit code 3), "
                                    "but this job waited for it to succeed (afterok)")
    assert why["events"][-1]["kind"] == "cancelled"
    assert why["events"][-1]["message"] == why["reason"]
    assert get(api, "/api/v1/jobs/on-ok/explain")["reason"].startswith(
        f"ok ({ok['id'][:8]}) succeeded, but this job waited for it to end without success")
    # afterany on a job that was cancelled holds: the chain's next job is let in
    assert get(api, f"/api/v1/jobs/{next_one['id']}")["state"] == "admitted"
    assert get(api, f"/api/v1/jobs/{on_ok['id']}")["state"] == "cancelled"
    assert get(api, f"/api/v1/jobs/{on_bad['id']}")["state"] == "cancelled"


def test_a_batch_chain_and_an_array_waited_for_as_a_whole(api):
    r = api.post("/api/v1/jobs/batch", headers=auth(api), json={"jobs": [
        {"spec": spec("prep")},
        {"spec": spec("sweep", array="0-2", depends_on="afterok:prep")},
        {"spec": spec("report", depends_on=[{"afterok": ["sweep"]},
                                            {"afterany": ["sweep_1"]}])}]})
    assert r.status_code == 201, r.text
    prep, sweep, report = r.json()
    assert sweep["pending"]["code"] == report["pending"]["code"] == "Dependency"
    assert api.tick() == [prep["id"]]
    assert "array sweep" in get(api, "/api/v1/jobs/report")["pending"]["reason"]
    # the queue shows the waiting array in one entry
    entry = [j for j in get(api, "/api/v1/queue") if j["name"] == "sweep"]
    assert [(j["array_tasks"], j["pending"]["code"]) for j in entry] == [
        ("0-2", "Dependency")]
    finish(api, "prep")
    assert len(api.tick()) == 3                        # the whole array
    for i in range(3):
        assert api.tick() == []
        finish(api, f"sweep_{i}")
    assert api.tick() == [report["id"]]


def test_an_array_submit_is_idempotent_with_its_key(api):
    body = {"spec": spec("sweep", array="0-9"), "idempotency_key": "k1"}
    first = api.post("/api/v1/jobs", json=body, headers=auth(api))
    again = api.post("/api/v1/jobs", json=body, headers=auth(api))
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert len(states(api, "sweep")) == 10
    body["spec"]["array"] = "0-19"
    assert api.post("/api/v1/jobs", json=body, headers=auth(api)).status_code == 409


def test_a_pass_reads_no_job_that_waits_for_its_turn_or_a_dependency(api):
    from tests.scheduler_core.service.test_report_statements import Statements

    big = submit(api, spec("big", roles=[{"name": "w", "replicas": 2, "gpus": 8}]))
    assert api.tick() == [big["id"]]
    r = api.post("/api/v1/jobs/batch", headers=auth(api), json={
        "jobs": [{"spec": spec(f"plain-{i}")} for i in range(300)]})
    assert r.status_code == 201, r.text
    with Statements(api.service.engine) as plain:
        api.tick()
    # the dependencies and arrays a pass looks at: one read each, none of them open
    gates = [q for q in plain.seen if "job_dependencies" in q or "job_arrays" in q]
    assert len(gates) == 2, gates
    submit(api, spec("sweep", array="0-999%2"))
    submit(api, spec("after", array="0-999", depends_on="afterok:big"))
    with Statements(api.service.engine) as more:
        api.tick()
    # the pass parsed the 300, the live job and the two elements with a turn: not the
    # 1998 elements that wait
    assert len(api.service.warm.jobs) == 300 + 1 + 2
    assert len(more.seen) - len(plain.seen) < 10, more.seen


def test_a_bad_dependency_row_does_not_stop_scheduling(api):
    first = submit(api, spec("first"))
    waiting = submit(api, spec("waiting", depends_on="afterok:first"))
    with api.service.sessions.begin() as s:       # a row no version of the service writes
        s.execute(DependencyRow.__table__.update().values(kind="bogus"))
    other = submit(api, spec("other"))
    assert set(api.tick()) == {first["id"], other["id"]}
    assert api.service.pass_errors == ["job"]
    assert get(api, f"/api/v1/jobs/{waiting['id']}")["pending"]["code"] == "Dependency"
