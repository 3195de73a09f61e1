"""Bad arrays and dependencies through the real API, on SQLite and PostgreSQL: each a 422
naming the field (its path), the value and the fix, and nothing made."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from airflow_gpu.scheduler_core.store.models import ArrayRow, DependencyRow, JobRow


def auth(api, who: str = "vision") -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def spec(name: str, **more) -> dict:
    return {"name": name, "roles": [{"name": "w", "gpus": 1}], **more}


def nothing_made(api, jobs: int = 0) -> None:
    with api.service.reads() as s:
        assert [s.scalar(select(func.count()).select_from(t))
                for t in (JobRow, ArrayRow, DependencyRow)] == [jobs, 0, 0]


@pytest.mark.parametrize("array, loc, said", [
    ("0-999999", ["body", "spec", "array", "range"],
     "makes 1000000 elements, over the most an array may have (10000)"),
    ({"range": "0-999999", "max_running": 8}, ["body", "spec", "array", "range"],
     "makes 1000000 elements"),
    ("5-1", ["body", "spec", "array", "range"], "5-1 runs backwards (5 to 1); write 1-5"),
    ("a-b", ["body", "spec", "array", "range"], "a-b is no index range; write indexes"),
    ("%0", ["body", "spec", "array", "range"], "%0 is no limit"),
    ("", ["body", "spec", "array", "range"], "an empty entry is no index range"),
    ({"range": "0-9", "max_running": 0}, ["body", "spec", "array", "max_running"],
     "0 is under the least accepted, 1; give 1 or more"),
])
def test_a_bad_array_is_refused_naming_the_field(api, array, loc, said):
    r = api.post("/api/v1/jobs", json={"spec": spec("sweep", array=array)},
                 headers=auth(api))
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == loc and said in err["msg"], err
    nothing_made(api)


@pytest.mark.parametrize("depends, said", [
    ("afterok", "afterok names no job"),
    ("afterok:a::b", "names no job after a colon"),
    ("after:x", "after is no dependency kind; use afterok, afterany or afternotok"),
    ("afterok:a?afterany:b", "'?' (any one of the conditions) is not supported"),
])
def test_a_malformed_dependency_is_refused_naming_the_field(api, depends, said):
    r = api.post("/api/v1/jobs", json={"spec": spec("x", depends_on=depends)},
                 headers=auth(api))
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "spec", "depends_on"] and said in err["msg"], err
    nothing_made(api)


def test_a_dependency_on_a_job_the_token_cannot_see_tells_nothing_of_it(api):
    theirs = api.post("/api/v1/jobs", json={"spec": spec("secret-plan")},
                      headers=auth(api, "nlp")).json()
    answers = {}
    for ref in ("secret-plan", theirs["id"], theirs["id"][:8], "no-such-job"):
        r = api.post("/api/v1/jobs", json={"spec": spec("mine", depends_on=f"afterok:{ref}")},
                     headers=auth(api))
        assert r.status_code == 422, r.text
        answers[ref] = r.json()["detail"]
        assert answers[ref].startswith(f"depends_on[0].afterok[0]: {ref!r} names no job your "
                                       "token can see"), answers[ref]
        assert "nlp" not in answers[ref] and "secret" not in answers[ref].replace(ref, "")
    nothing_made(api, jobs=1)
    # an admin sees every team's jobs
    r = api.post("/api/v1/jobs", headers=auth(api, "admin"), json={
        "spec": spec("ops-job", team="vision", depends_on="afterok:secret-plan")})
    assert r.status_code == 201, r.text


def test_a_batch_with_a_bad_dependency_or_a_cycle_makes_nothing(api):
    def batch(*specs):
        r = api.post("/api/v1/jobs/batch", headers=auth(api),
                     json={"jobs": [{"spec": s} for s in specs]})
        assert r.status_code == 422, r.text
        return r.json()["detail"]

    said = batch(spec("a", depends_on="afterok:c"),
                 spec("b", array="0-3", depends_on="afterok:a"),
                 spec("c", depends_on="afterany:b_2"))
    assert "b_2" not in said and said.startswith("jobs[0] (name 'a'): depends_on: the jobs "
                                                 "a, c, b wait for each other (a -> c -> b ->"
                                                 " a)"), said
    said = batch(spec("a"), spec("b", depends_on="afterok:a:nowhere"))
    assert said.startswith("jobs[1] (name 'b'): depends_on[0].afterok[1]: 'nowhere' names no"
                           " job"), said
    said = batch(spec("a", array="0-3"), spec("b", depends_on="afterok:a_7"))
    assert "element 7 of the array a, which has no such index" in said
    said = batch(spec("a", array="0-9999"), spec("b", array="0-9"))
    assert "makes 10010 jobs" in said
    nothing_made(api)


def test_cancel_needs_a_filter_or_a_reference(api):
    r = api.post("/api/v1/jobs/cancel", json={}, headers=auth(api))
    assert r.status_code == 422 and "give job references (jobs) or at least one filter" in \
        r.json()["detail"]
    r = api.post("/api/v1/jobs/cancel", json={"state": "succeeded"}, headers=auth(api))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "state"]
