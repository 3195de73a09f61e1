"""Webhook notifications through the real app and store (SQLite and PostgreSQL) to a real
HTTP receiver on loopback: a job's own subscription and its team's, each told what it
asked for once, signed with the team's secret; the URL allow-list refusing a spec and a
team setting; a rotated secret; the idle policy's `notify`; retries, and give-ups; the
body naming a job's user and array element, as the docs list it."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from airflow_gpu.scheduler_core.jobspec import NOTIFY_EVENTS
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.models import EventRow, NotificationRow
from tests.databases import serve
from tests.helpers import REPO, until
from tests.scheduler_core.api.test_api import auth, submit
from tests.scheduler_core.service.test_accounting import report
from tests.scheduler_core.service.test_reclaim_and_requeue import beat, job
from tests.webhooks import Receiver

ALLOWED = "http://127.0.0.1:"
RULES = {"allowed_urls": [ALLOWED], "retry_first": 1, "retry_max": 1, "timeout": 2}


@pytest.fixture
def api(db_url):
    yield from serve(db_url, PolicyConfig.model_validate({"notifications": RULES}))


@pytest.fixture
def idle_api(db_url):
    policy = {"notifications": RULES, "idle": {"after": 1, "action": "notify"}}
    yield from serve(db_url, PolicyConfig.model_validate(policy))


@pytest.fixture
def short_api(db_url):
    """Deliveries given up 2 s after their event."""
    rules = {**RULES, "give_up_after": 2}
    yield from serve(db_url, PolicyConfig.model_validate({"notifications": rules}))


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(*answers: int) -> Receiver:
        made.append(Receiver(answers or (200,)).start())
        return made[-1]
    yield make
    for r in made:
        r.stop()


def spec(name: str, **more) -> dict:
    return {"name": name, "expected_runtime": "1h", "roles": [{"name": "w", "gpus": 1}],
            **more}


def set_team(api, team: str, body: dict, who: str = "admin"):
    return api.put(f"/api/v1/teams/{team}", json=body, headers=auth(api, who))


def webhook(api, team: str, url: str, events: list[str] | None = None) -> str:
    """Give `team` a webhook and a new secret; returns the secret."""
    r = set_team(api, team, {"webhook_url": url, "webhook_secret": "new",
                             **({"webhook_events": events} if events else {})})
    assert r.status_code == 200, r.text
    return r.json()["webhook_secret"]


def finish(api, j: dict, outcome: str, code: int | None = None) -> dict:
    r = api.post(f"/api/v1/jobs/{j['id']}/finish", headers=auth(api, "vision"),
                 json={"outcome": outcome, "exit_code": code, "attempt": j["attempt"]})
    assert r.status_code == 200, r.text
    return r.json()


def test_job_and_team_webhooks_each_get_what_they_asked_for_once_signed(api, receivers):
    team_hook, job_hook = receivers(), receivers()
    secret = webhook(api, "vision", team_hook.url, ["start"])
    assert secret.startswith("whsec_")
    r = submit(api, "vision", spec("train", notify={"url": job_hook.url}), key="d/t/r/-1/1")
    assert r.status_code == 201, r.text
    j = r.json()
    other = submit(api, "nlp", spec("other", notify=None)).json()   # a team with no hook
    assert sorted(api.tick()) == sorted([j["id"], other["id"]])
    j = beat(api, job(api, j["id"]))                                 # running
    finish(api, j, "failed", 3)
    api.deliver()

    starts = team_hook.wait(2)
    assert [(b["event"], b["kind"]) for b in starts] == [("admitted", "start"),
                                                         ("running", "start")]
    (failed,) = job_hook.wait(1)                      # default events: end and failure
    assert (failed["event"], failed["kind"], failed["version"]) == ("failed", "failure", 1)
    assert failed["job"] == {
        "id": j["id"], "name": "train", "team": "vision", "user": None, "array_id": None,
        "array_index": None, "state": "failed", "attempt": 1,
        "exit_code": 3, "reason": None, "requeue_reason": None,
        "links": {"api": f"/api/v1/jobs/{j['id']}",
                  "airflow": {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1,
                              "try_number": 1}}}
    assert failed["message"] == "failed (exit code 3)"
    assert all(team_hook.signed_with(secret)) and all(job_hook.signed_with(secret))
    assert not any(job_hook.signed_with(secret + "x"))
    headers = [h for h, _ in team_hook.got + job_hook.got]
    ids = [h["x-airflow-gpu-delivery"] for h in headers]
    assert len(set(ids)) == 3 and ids == [b["delivery_id"] for b in starts + [failed]]
    assert [h["x-airflow-gpu-event"] for h in headers] == ["start", "start", "failure"]

    api.deliver()                                     # nothing is sent twice
    assert (len(team_hook.got), len(job_hook.got)) == (2, 1)
    shown = api.get(f"/api/v1/jobs/{j['id']}/explain", headers=auth(api, "nlp")).json()
    assert [(n["kind"], n["source"], n["state"], n["attempts"])
            for n in shown["notifications"]] == [("start", "team", "delivered", 1),
                                                 ("start", "team", "delivered", 1),
                                                 ("failure", "job", "delivered", 1)]
    assert api.get(f"/api/v1/jobs/{other['id']}/notifications",
                   headers=auth(api, "nlp")).json() == []


def test_urls_outside_the_allow_list_are_refused_naming_the_field_url_and_setting(api):
    r = submit(api, "vision", spec("t", notify={"url": "http://10.0.0.1/hook"}))
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "notify.url: 'http://10.0.0.1/hook' is not an allowed webhook URL: the service only "
        "POSTs to URLs that start with one of the policy file's notifications.allowed_urls "
        "(http://127.0.0.1:); use such a URL, or have an admin add its prefix there")
    r = set_team(api, "vision", {"webhook_url": "https://hooks.example.com/x",
                                 "webhook_secret": "new"})
    assert r.status_code == 422 and r.json()["detail"].startswith(
        "webhook_url: 'https://hooks.example.com/x' is not an allowed webhook URL")
    assert "notifications.allowed_urls" in r.json()["detail"]
    # an allowed URL, but no secret to sign with yet: the job, then the team
    r = submit(api, "vision", spec("t", notify={"url": ALLOWED + "9/hook"}))
    assert r.status_code == 422 and "airflow-gpu team-set vision --webhook-secret new" in \
        r.json()["detail"]
    r = set_team(api, "vision", {"webhook_url": ALLOWED + "9/hook"})
    assert r.status_code == 422 and "--webhook-secret new" in r.json()["detail"]
    r = submit(api, "vision", spec("t", notify={"url": "ftp://127.0.0.1/x"}))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-2:] == ["notify", "url"]
    assert set_team(api, "vision", {"webhook_secret": "new"}, who="vision").status_code == 403
    # nothing was stored on the way: no webhook, no secret
    teams = api.get("/api/v1/teams", headers=auth(api, "vision")).json()
    assert all((t["webhook_url"], t["webhook_secret_hint"]) == (None, None) for t in teams)


def test_a_webhook_alone_leaves_the_teams_shares_and_a_share_alone_its_webhook(api):
    assert set_team(api, "vision", {"share": 3, "quota_gpus": 8}).status_code == 200
    webhook(api, "vision", ALLOWED + "9/hook")
    (vision,) = [t for t in api.get("/api/v1/teams", headers=auth(api, "vision")).json()
                 if t["name"] == "vision"]
    assert (vision["share"], vision["quota_gpus"]) == (3, 8)
    assert vision["webhook_events"] == ["end", "failure"]
    r = set_team(api, "vision", {"share": 2})
    assert (r.json()["share"], r.json()["webhook_url"]) == (2, ALLOWED + "9/hook")
    r = set_team(api, "vision", {"webhook_url": None})
    assert (r.json()["share"], r.json()["webhook_url"]) == (2, None)


def test_a_rotated_secret_signs_from_then_on_and_is_never_shown_again(api, receivers):
    hook = receivers()
    old = webhook(api, "vision", hook.url, ["start", "end"])
    first = submit(api, "vision", spec("a")).json()
    api.tick()
    api.deliver()
    hook.wait(1)
    r = set_team(api, "vision", {"webhook_secret": "new"})
    new = r.json()["webhook_secret"]
    assert new != old and r.json()["webhook_url"] == hook.url     # the URL stays
    api.delete(f"/api/v1/jobs/{first['id']}", headers=auth(api, "vision"))   # cancelled
    api.deliver()
    hook.wait(2)
    assert hook.signed_with(old) == [True, False]
    assert hook.signed_with(new) == [False, True]
    # after its creation the secret is in no answer and no event; lists show a hint
    teams = api.get("/api/v1/teams", headers=auth(api, "admin"))
    assert old not in teams.text and new not in teams.text
    (vision,) = [t for t in teams.json() if t["name"] == "vision"]
    assert vision["webhook_secret_hint"] == f"whsec_...{new[-4:]}"
    assert vision["webhook_secret"] is None
    with api.service.reads() as s:
        said = " ".join(s.scalars(select(EventRow.message)))
        sent = " ".join(s.scalars(select(NotificationRow.body)))
    assert "rotated" in said and old not in said + sent and new not in said + sent


def test_idle_action_notify_sends_one_notification_when_a_job_is_flagged(idle_api,
                                                                          receivers):
    api, hook = idle_api, receivers()
    secret = webhook(api, "vision", hook.url, ["end"])      # idle is not asked for
    j = submit(api, "vision", spec("notebook")).json()
    api.tick()
    j = beat(api, job(api, j["id"]))
    (rep,) = j["replicas"]
    idle = {g: {"utilization_gpu": 0.0} for g in rep["gpus"]}

    def flagged():
        report(api, rep["host"], idle)
        return job(api, j["id"])["idle_flagged_at"]

    until(flagged, "the idle policy flags the job", every=0.3)
    for _ in range(3):           # still idle: flagged once, told once
        report(api, rep["host"], idle)
    api.deliver()
    (told,) = hook.wait(1)
    assert (told["event"], told["kind"], told["job"]["state"]) == ("idle", "idle", "running")
    assert told["message"].startswith("idle: its 1 GPU have stayed under 5 %")
    assert hook.signed_with(secret) == [True]
    (n,) = api.get(f"/api/v1/jobs/{j['id']}/notifications",
                   headers=auth(api, "vision")).json()
    assert (n["source"], n["state"]) == ("policy", "delivered")
    assert job(api, j["id"])["state"] == "running"      # and nothing else is done
    time.sleep(0.2)
    api.deliver()
    assert len(hook.got) == 1


def test_a_failing_receiver_is_retried_and_a_refusing_one_given_up(api, receivers):
    flaky, refusing = receivers(503, 500, 200), receivers(400)
    webhook(api, "vision", flaky.url, ["start"])
    j = submit(api, "vision", spec("a", notify={"url": refusing.url,
                                                "events": ["start"]})).json()
    api.tick()
    api.deliver()                     # the first attempt of each
    assert (len(flaky.got), len(refusing.got)) == (1, 1)
    (retrying, given_up) = sorted(api.get(f"/api/v1/jobs/{j['id']}/notifications",
                                          headers=auth(api, "vision")).json(),
                                  key=lambda n: n["source"] == "job")
    assert (retrying["state"], retrying["attempts"]) == ("pending", 1)
    assert retrying["last_error"] == "HTTP 503 Service Unavailable"
    assert retrying["next_attempt_at"] is not None
    assert (given_up["state"], given_up["last_error"]) == (
        "given_up", "the receiver answered HTTP 400 Bad Request")
    events = api.get(f"/api/v1/jobs/{j['id']}/explain", headers=auth(api, "vision")).json()
    (said,) = [e for e in events["events"] if e["kind"] == "notification"]
    assert said["message"] == (f"notification 'start' of event {given_up['event_id']} to "
                               f"http://127.0.0.1:{refusing.port}/… given up: the receiver "
                               "answered HTTP 400 Bad Request")
    api.deliver()                     # not due yet: the back-off is a second ...
    if datetime.now(UTC) < datetime.fromisoformat(retrying["next_attempt_at"]):
        assert len(flaky.got) == 1    # (... unless a loaded machine took longer)

    def delivered():
        api.deliver()
        return len(flaky.got) == 3
    until(delivered, "the third attempt", timeout=10, every=0.2)
    assert {b["delivery_id"] for b in flaky.bodies()} == {retrying["delivery_id"]}
    # the admins' list: only the given-up one is left; teams may not read it
    listed = api.get("/api/v1/notifications", headers=auth(api, "admin")).json()
    assert [(n["delivery_id"], n["state"]) for n in listed] == [
        (given_up["delivery_id"], "given_up")]
    r = api.get("/api/v1/notifications", headers=auth(api, "vision"))
    assert r.status_code == 403 and "only admins" in r.json()["detail"]
    text = api.app.state.metrics.registry
    assert text.get_sample_value("airflow_gpu_webhook_deliveries_total",
                                 {"outcome": "failed"}) == 2


def test_a_receiver_down_past_give_up_after_is_given_up_and_the_next_still_sent(short_api):
    api, down = short_api, Receiver()     # never started: connections are refused
    webhook(api, "vision", down.url, ["start"])
    j = submit(api, "vision", spec("a")).json()
    api.tick()

    def given_up():
        api.deliver()
        (n,) = api.get(f"/api/v1/jobs/{j['id']}/notifications",
                       headers=auth(api, "vision")).json()
        return n if n["state"] == "given_up" else None

    n = until(given_up, "the give-up", timeout=10, every=0.2)
    assert n["attempts"] >= 2 and "ConnectError" in n["last_error"]
    assert n["last_error"].startswith("still failing after")
    down.start()                          # up again: the next event goes out
    try:
        beat(api, job(api, j["id"]))
        api.deliver()
        assert [b["event"] for b in down.wait(1)] == ["running"]
    finally:
        down.stop()


def test_the_body_tells_array_elements_and_users_apart(api, receivers):
    hook = receivers()
    webhook(api, "vision", hook.url, ["start"])
    api.tokens["alice"] = create_token(api.service.sessions, "vision", user="alice")
    r = submit(api, "alice", spec("sweep", array="0-1"))
    assert r.status_code == 201, r.text
    first = r.json()
    assert len(api.tick()) == 2
    api.deliver()
    told = [b["job"] for b in hook.wait(2)]
    assert sorted((j["name"], j["array_index"], j["user"]) for j in told) == [
        ("sweep", 0, "alice"), ("sweep", 1, "alice")]
    assert {j["array_id"] for j in told} == {first["array_id"]} != {None}


def test_the_docs_name_every_kind_and_every_field_of_the_body():
    page = (REPO / "docs" / "notifications.md").read_text()
    (kind,) = [line for line in page.splitlines() if line.startswith("| `kind` |")]
    assert re.findall(r"`(\w+)`", kind.split("|")[2]) == list(NOTIFY_EVENTS)
    (job_row,) = [line for line in page.splitlines() if line.startswith("| `job` |")]
    for field in ("id", "name", "team", "user", "array_id", "array_index", "state",
                  "attempt", "exit_code", "reason", "requeue_reason"):
        assert f"`{field}`" in job_row, field
