"""Deadlines where they meet the rest (issue 44, points 10 and 11), through the real app
on SQLite and PostgreSQL: a deadline in the past, a year or more ahead, or `downstream`
without one is refused wherever a spec enters; a lost cause never preempts, and whose
deadlines may preempt is the policy's per team, shown in `prio`; the API names the
pipeline's deadline apart from the time limit's end, with the slack, in `status` and
`explain`; a running job that will miss and a job waiting behind one are at risk."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rich.console import Console

from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.jobfile import job_request, read_jobs
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.common import utcnow
from tests.databases import serve

ONE_HOST = ({"name": "dgx-1", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
RULE = {"rules": [{"on_deadline": True, "preempts_below": 1}], "min_run_time": 0}


def _auth(api, team: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[team]}"}


def spec(name: str, **more) -> dict:
    return {"name": name, "roles": [{"name": "w", "gpus": 8}], "expected_runtime": "1h",
            **more}


def submit(api, team: str, name: str, **more) -> dict:
    r = api.post("/api/v1/jobs", headers=_auth(api, team), json={"spec": spec(name, **more)})
    assert r.status_code == 201, r.text
    return r.json()


def job(api, job_id: str, what: str = "") -> dict:
    r = api.get(f"/api/v1/jobs/{job_id}{what}", headers=_auth(api, "admin"))
    assert r.status_code == 200, r.text
    return r.json()


def due(hours: float) -> str:
    return (utcnow() + timedelta(hours=hours)).isoformat()


def render(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


@pytest.fixture
def api(db_url):
    yield from serve(db_url, hosts=ONE_HOST)


@pytest.fixture
def rule_api(db_url):
    """A rule on_deadline; team nlp's deadlines may not preempt (the policy says so)."""
    policy = PolicyConfig.model_validate({"preemption": RULE,
                                          "teams": {"nlp": {"deadline_preempts": False}}})
    yield from serve(db_url, policy=policy, hosts=ONE_HOST)


# -- point 10: refused where a spec enters --------------------------------------------------
BAD = [({"deadline": "1970-01-01T00:00:00Z"}, ["deadline", "'1970-01-01T00:00:00Z'",
                                               "is in the past (now ", "leave deadline out"]),
       ({"deadline": "0001-01-01T00:00:00Z"}, ["'0001-01-01T00:00:00Z' is in the past"]),
       ({"deadline": "9999-12-31T00:00:00Z"}, ["'9999-12-31T00:00:00Z' is more than a year "
                                               "ahead (now ", "the latest accepted is"]),
       ({"downstream": "2h"}, ["downstream", "2h is given without a deadline",
                               "add deadline"])]


def test_a_deadline_past_or_far_ahead_or_downstream_alone_is_refused_everywhere(api, tmp_path):
    yesterday = (utcnow() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cases = [*BAD, ({"deadline": yesterday}, [f"'{yesterday}' is in the past"])]
    for fields, words in cases:
        for r in (api.post("/api/v1/jobs", headers=_auth(api, "vision"),
                           json={"spec": spec("bad", **fields)}),
                  api.post("/api/v1/jobs/batch", headers=_auth(api, "vision"), json={
                      "jobs": [{"spec": spec("ok")}, {"spec": spec("bad", **fields)}]})):
            assert r.status_code == 422, r.text
            for w in words:
                assert w in r.text, (w, r.text)
        # plan, submit and run read a file, the operators check their arguments: the same
        path = tmp_path / "job.yaml"
        path.write_text("".join(f"{k}: {v}\n" for k, v in spec("bad", **fields).items()
                                if k != "roles") + "roles: [{name: w, gpus: 1}]\n")
        for check, arg in ((read_jobs, path), (job_request, spec("bad", **fields))):
            with pytest.raises(InputError) as exc:
                check(arg) if check is read_jobs else check(arg, "task 't'")
            for w in words:
                assert w in str(exc.value), (w, str(exc.value))
    assert api.get("/api/v1/jobs", headers=_auth(api, "vision")).json() == []   # none kept
    # a deadline ahead, within the year, with its downstream: taken, and kept as written
    ok = submit(api, "vision", "ok", deadline=due(300 * 24), downstream="2h")
    assert ok["spec"]["downstream"] == "2h" and ok["pipeline_deadline_at"]


def test_a_lost_cause_never_preempts(rule_api):
    """Due in 30 min with 1 h of work: it misses even if it started now. It waited with
    DeadlineAtRisk and preempted the other team's running job all the same."""
    api = rule_api
    busy = submit(api, "nlp", "busy", expected_runtime="5h")
    api.tick()
    lost = submit(api, "vision", "lost", deadline=due(0.5))
    for _ in range(2):
        assert api.tick() == []
    assert job(api, busy["id"])["state"] == "admitted"
    pending = job(api, lost["id"])["pending"]
    assert pending["code"] == "DeadlineAtRisk" and "should have started" in \
        pending["reason"], pending
    # one that can still make it by preempting does (the rule works here)
    tight = submit(api, "vision", "tight", deadline=due(3))
    api.tick()
    assert job(api, busy["id"])["preempted_by"] == tight["id"]


def test_whose_deadlines_preempt_is_the_policys_per_team_and_prio_shows_it(rule_api):
    api = rule_api
    busy = submit(api, "vision", "busy", expected_runtime="5h")
    api.tick()
    # due in 3 h with 1 h of work, 5 h of busy ahead: at risk, but nlp may not preempt
    tight = submit(api, "nlp", "tight", deadline=due(3))
    for _ in range(2):
        api.tick()
    assert job(api, busy["id"])["state"] == "admitted"
    assert job(api, tight["id"])["pending"]["code"] == "DeadlineAtRisk"
    mine = submit(api, "vision", "mine", deadline=due(9))
    prio = api.get("/api/v1/priorities", headers=_auth(api, "admin")).json()
    assert prio["on_deadline_rule"] is True
    rows = {j["name"]: j for j in prio["jobs"]}
    assert rows["tight"]["deadline_preempts"] is False
    assert rows["mine"]["deadline_preempts"] is True and mine["id"] == rows["mine"]["id"]
    from airflow_gpu.cli.commands.slurm_command import prio_table

    text = render(prio_table(prio))
    assert "may preempt" in text and "deadline_preempts" in text
    line = next(x for x in text.splitlines() if " tight " in x)
    assert " no " in line, line


# -- point 11: the pipeline's deadline apart, its slack, and who is at risk ----------------
def test_a_running_job_that_will_miss_its_pipelines_deadline_is_at_risk(api):
    from airflow_gpu.cli.commands.jobs_command import _explain_table
    from airflow_gpu.cli.commands.status_view import job_table

    late = submit(api, "vision", "late", deadline=due(2), expected_runtime="3h",
                  time_limit="4h")
    api.tick()
    got = job(api, late["id"])
    assert got["state"] == "admitted"
    # the time limit's end and the pipeline's deadline are two fields, two times
    assert got["pipeline_deadline_at"] and got["deadline_at"]
    assert got["pipeline_deadline_at"] != got["deadline_at"]
    # due in 2 h, expected to end in 3 h: about an hour late
    assert -3700 <= got["deadline_slack_s"] <= -3500 and got["deadline_at_risk"], got
    said = job(api, late["id"], "/explain")
    assert said["deadline_at_risk"] and said["deadline_slack_s"] == got["deadline_slack_s"]
    assert said["pipeline_deadline_at"] == got["pipeline_deadline_at"]
    for text in (render(job_table(got)), render(_explain_table(said))):
        assert "pipeline deadline " in text and "at risk, about " in text, text


def test_a_running_job_with_time_to_spare_is_not_at_risk(api):
    easy = submit(api, "vision", "easy", deadline=due(5), downstream="1h")
    api.tick()
    got = job(api, easy["id"])
    # 5 h - 1 h of work after it - 1 h of its own: about 3 h to spare
    assert 10700 <= got["deadline_slack_s"] <= 10800 and not got["deadline_at_risk"], got
    from airflow_gpu.cli.commands.status_view import due_line

    assert due_line(got).endswith(": 2h59m to spare") or due_line(got).endswith(
        ": 3h to spare"), due_line(got)


def test_a_job_waiting_behind_one_that_lost_its_deadline_is_at_risk(api):
    """head runs 3 h for a pipeline due in 2 h; next waits for it (afterok): its pipeline
    is lost too, and says so once, with the job that lost it; other, behind a job with
    time to spare, keeps its plain Dependency reason."""
    head = submit(api, "vision", "head", deadline=due(2), expected_runtime="3h")
    api.tick()
    nxt = submit(api, "vision", "next", deadline=due(2), depends_on=f"afterok:{head['id']}",
                 expected_runtime="10m")
    plain = submit(api, "vision", "plain", deadline=due(9), expected_runtime="10m",
                   depends_on=f"afterok:{nxt['id']}")
    for _ in range(2):                            # the second pass says nothing new
        api.tick()
    got = job(api, nxt["id"])
    pending = got["pending"]
    assert pending["code"] == "DeadlineAtRisk", pending
    assert pending["details"]["cause"] == "Dependency", pending
    assert pending["details"]["lost_by"] == head["id"]
    assert pending["reason"].startswith(f"deadline at risk: head ({head['id'][:8]}), which "
                                        "it waits for, is expected to end "), pending["reason"]
    assert "Waiting for: Dependency: waits for head" in pending["reason"]
    assert got["deadline_at_risk"]
    events = job(api, nxt["id"], "/explain")["events"]
    assert [e["kind"] for e in events].count("deadline") == 1, events
    metrics = api.get("/metrics").text
    assert 'airflow_gpu_deadline_at_risk_jobs{team="vision"} 1.0' in metrics
    # plain waits for next, whose own pipeline is at risk but not lost: no claim on plain
    assert job(api, plain["id"])["pending"]["code"] == "Dependency"
    # head ends: next is let in, its dependency reason gone
    h = job(api, head["id"])
    r = api.post(f"/api/v1/jobs/{head['id']}/finish", headers=_auth(api, "vision"),
                 json={"outcome": "succeeded", "attempt": h["attempt"]})
    assert r.status_code == 200, r.text
    api.tick()
    assert job(api, nxt["id"])["state"] == "admitted"
