"""Deadlines through the real app on SQLite and PostgreSQL: a job whose pipeline's
deadline it cannot meet waits with DeadlineAtRisk and the numbers, an event says so
once (and goes to a webhook that asked for `deadline`), /metrics counts it per team, and
a job with slack to spare keeps its plain reason."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.common import utcnow
from tests.databases import serve

ONE_HOST = ({"name": "dgx-1", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


@pytest.fixture
def api(db_url):
    policy = PolicyConfig.model_validate({"notifications": {
        "allowed_urls": ["http://127.0.0.1:"]}})
    yield from serve(db_url, policy=policy, hosts=ONE_HOST)


def submit(api, team: str, name: str, **more) -> dict:
    r = api.post("/api/v1/jobs", headers={"Authorization": f"Bearer {api.tokens[team]}"},
                 json={"spec": {"name": name, "roles": [{"name": "w", "gpus": 8}],
                                "expected_runtime": "1h", **more}})
    assert r.status_code == 201, r.text
    return r.json()


def job(api, job_id: str) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}",
                   headers={"Authorization": f"Bearer {api.tokens['vision']}"}).json()


def test_a_job_that_cannot_meet_its_deadline_is_told_once_and_counted(api):
    busy = submit(api, "nlp", "busy", expected_runtime="2h")
    api.tick()
    assert job(api, busy["id"])["state"] == "admitted"
    r = api.put("/api/v1/teams/vision", headers={
        "Authorization": f"Bearer {api.tokens['admin']}"}, json={"webhook_secret": "new"})
    assert r.status_code == 200, r.text
    due = (utcnow() + timedelta(hours=2)).isoformat()
    tight = submit(api, "vision", "tight", deadline=due, downstream="30m",
                   notify={"url": "http://127.0.0.1:9/hook", "events": ["deadline"]})
    easy = submit(api, "vision", "easy",
                  deadline=(utcnow() + timedelta(hours=9)).isoformat())
    assert tight["spec"]["deadline"] and tight["spec"]["downstream"] == "30m"
    for _ in range(2):                      # a second pass says nothing new
        api.tick()
    got = job(api, tight["id"])["pending"]
    assert got["code"] == "DeadlineAtRisk", got
    assert got["details"]["cause"] in ("Resources", "Priority")
    # due in 2 h, 1 h 30 min of work from its start: it should start within 30 min, and
    # the busy job holds the host for 2 h: about 1 h 30 min late
    assert 5300 <= got["details"]["expected_late_s"] <= 5400, got
    assert "deadline at risk: its pipeline is due in 1h59m" in got["reason"]
    assert job(api, easy["id"])["pending"]["code"] != "DeadlineAtRisk"

    events = api.get(f"/api/v1/jobs/{tight['id']}/explain", headers={
        "Authorization": f"Bearer {api.tokens['vision']}"}).json()["events"]
    said = [e for e in events if e["kind"] == "deadline"]
    assert len(said) == 1 and said[0]["message"].startswith("deadline at risk"), events
    notes = api.get(f"/api/v1/jobs/{tight['id']}/notifications", headers={
        "Authorization": f"Bearer {api.tokens['vision']}"}).json()
    assert [n["kind"] for n in notes] == ["deadline"], notes

    metrics = api.get("/metrics").text
    assert 'airflow_gpu_deadline_at_risk_jobs{team="vision"} 1.0' in metrics
    assert 'airflow_gpu_pending_jobs{reason="DeadlineAtRisk",team="vision"} 1.0' in metrics


def test_prio_shows_each_jobs_slack_and_who_goes_first_for_a_deadline(api):
    from rich.console import Console

    from airflow_gpu.cli.commands.slurm_command import prio_table

    submit(api, "nlp", "busy", expected_runtime="2h")
    api.tick()
    plain = submit(api, "nlp", "plain")
    soon = submit(api, "vision", "soon",
                  deadline=(utcnow() + timedelta(hours=3)).isoformat())
    later = submit(api, "vision", "later",
                   deadline=(utcnow() + timedelta(hours=9)).isoformat())
    prio = api.get("/api/v1/priorities", headers={
        "Authorization": f"Bearer {api.tokens['vision']}"}).json()
    rows = {j["id"]: j for j in prio["jobs"]}
    # due in 3 h with 1 h of work: 2 h of slack, under the default 4 h: it goes first
    assert [j["name"] for j in prio["jobs"]][0] == "soon"
    assert rows[soon["id"]]["deadline_first"] and 7100 < rows[soon["id"]]["slack_s"] <= 7200
    assert not rows[later["id"]]["deadline_first"] and rows[later["id"]]["slack_s"] > 28000
    assert rows[plain["id"]]["slack_s"] is None and rows[plain["id"]]["latest_start_at"] is None
    console = Console(width=200, record=True)
    console.print(prio_table(prio))
    text = console.export_text()
    assert "slack" in text and "deadline_slack (4h)" in text
    line = next(x for x in text.splitlines() if " soon " in x)
    assert "1h59m" in line and line.rstrip(" │").endswith("deadline"), line


@pytest.fixture
def rule_api(db_url):
    """One host; a rule on_deadline: a job whose deadline is at risk stops band-0 work
    without a deadline (its own band included)."""
    policy = PolicyConfig.model_validate({"preemption": {
        "rules": [{"on_deadline": True, "preempts_below": 1}], "min_run_time": 0}})
    yield from serve(db_url, policy=policy, hosts=ONE_HOST)


def test_a_job_whose_deadline_is_at_risk_preempts_work_of_its_band_under_a_rule(rule_api):
    api = rule_api
    busy = submit(api, "nlp", "busy", expected_runtime="5h")
    api.tick()
    # due in 3 h with 1 h of work: it can wait 2 h, not the 5 h busy holds the host for
    tight = submit(api, "vision", "tight", deadline=(utcnow() + timedelta(hours=3)).isoformat())
    assert api.tick() == []
    b = job(api, busy["id"])
    assert b["state"] == "preempting" and b["preempted_by"] == tight["id"], b
    assert "its deadline is at risk: it must start within 1h59m" in b["preempt_reason"]
    assert "a rule on_deadline lets its band 0 preempt band 0 work without a deadline" \
        in b["preempt_reason"]
    assert job(api, tight["id"])["pending"]["code"] == "Preempting"
    r = api.post(f"/api/v1/jobs/{busy['id']}/finish", headers={
        "Authorization": f"Bearer {api.tokens['nlp']}"},
        json={"outcome": "preempted", "attempt": b["attempt"]})
    assert r.status_code == 200, r.text
    assert api.tick() == [tight["id"]]
    assert job(api, busy["id"])["requeue_reason"] == "preempted"

    # a job with a deadline of its own is never stopped for another's in its band
    later = submit(api, "vision", "later", expected_runtime="30m",
                   deadline=(utcnow() + timedelta(hours=1)).isoformat())
    api.tick()
    assert job(api, tight["id"])["state"] == "admitted"
    assert job(api, later["id"])["pending"]["code"] == "DeadlineAtRisk"
