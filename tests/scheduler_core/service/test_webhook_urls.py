"""Webhook URLs through the real app and store (SQLite and PostgreSQL), to real receivers
on loopback: a URL the sender cannot parse is refused where it is given, and one stored
before that is given up once, with an event and one log line; other teams see URLs
without their path and query; a request signed for one URL does not verify at another,
by the service's check and by the one the docs show."""

from __future__ import annotations

import logging
import re

import httpx
import pytest
from sqlalchemy import update

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service import webhooks
from airflow_gpu.scheduler_core.service.webhooks import verify
from airflow_gpu.scheduler_core.store.models import WebhookRow
from tests.databases import serve
from tests.helpers import REPO
from tests.scheduler_core.api.test_api import auth, submit
from tests.scheduler_core.service.test_notifications import (
    ALLOWED,
    RULES,
    set_team,
    spec,
    webhook,
)
from tests.webhooks import Receiver

UNPARSEABLE = ["http://127.0.0.1:80.evil.com/", "http://127.0.0.1:abc/hook",
               "http://127.0.0.1:80%40evil/hook", "http://127.0.0.1%40evil/hook",
               "http://127.0.0.1:9/a\r\nX-Injected: 1", "http://127.0.0.1:9/a\tb",
               "http://127.0.0.1:9/a\x00b", "http://127.0.0.1:99999/hook"]
FIX = "write it as http(s)://host[:port]/path"
SECRET = "s3cr3tT0ken"


@pytest.fixture
def api(db_url):
    yield from serve(db_url, PolicyConfig.model_validate({"notifications": RULES}))


def test_urls_the_sender_cannot_parse_are_refused_at_submit_and_team_set(api):
    webhook(api, "vision", ALLOWED + "9/hook")
    for url in UNPARSEABLE:
        r = submit(api, "vision", spec("t", notify={"url": url}))
        assert r.status_code == 422, (url, r.text)
        (err,) = r.json()["detail"]
        assert err["loc"][-2:] == ["notify", "url"]
        assert err["msg"].startswith(repr(url)) and FIX in err["msg"], err["msg"]
        r = set_team(api, "vision", {"webhook_url": url})
        assert r.status_code == 422, (url, r.text)
        said = r.json()["detail"]
        assert said.startswith(f"webhook_url: {url!r} ") and FIX in said, said
        assert not re.search(r"[\x00-\x1f]", err["msg"] + said)      # escaped
    (vision,) = [t for t in api.get("/api/v1/teams", headers=auth(api, "vision")).json()
                 if t["name"] == "vision"]
    assert vision["webhook_url"] == ALLOWED + "9/hook"           # as it was
    assert api.get("/api/v1/jobs", headers=auth(api, "vision")).json() == []


@pytest.mark.parametrize("bad", ["http://127.0.0.1:80.evil.com/x",
                                 "http://127.0.0.1:9/a\r\nX-Injected: 1"])
def test_a_stored_url_the_sender_cannot_parse_is_given_up_once_with_an_event(
        api, caplog, bad):
    webhook(api, "vision", ALLOWED + "9/hook", ["start"])
    with api.service.sessions.begin() as s:       # as a store from before URLs were checked
        s.execute(update(WebhookRow).where(WebhookRow.team == "vision").values(url=bad))
    j = submit(api, "vision", spec("a")).json()
    api.tick()
    with caplog.at_level(logging.WARNING, logger=webhooks.__name__):
        for _ in range(5):
            api.deliver()
    (n,) = api.get(f"/api/v1/jobs/{j['id']}/notifications",
                   headers=auth(api, "vision")).json()
    assert (n["state"], n["attempts"]) == ("given_up", 0)
    assert n["last_error"].startswith("its URL cannot be sent to (invalid ")
    events = api.get(f"/api/v1/jobs/{j['id']}/explain", headers=auth(api, "vision")).json()
    (said,) = [e["message"] for e in events["events"] if e["kind"] == "notification"]
    shown = "http://127.0.0.1:80.evil.com/…" if "evil" in bad else "http://127.0.0.1:9/…"
    assert said == (f"notification 'start' of event {n['event_id']} to {shown} given up: "
                    f"{n['last_error']}")
    (line,) = [r.getMessage() for r in caplog.records if r.name == webhooks.__name__]
    assert said in line and "\r" not in line and "\n" not in line


def test_other_teams_see_webhook_urls_without_their_path_and_query(api):
    team_hook, job_hook = Receiver().start(), Receiver((400,)).start()
    try:
        team_url = f"{team_hook.url}/T0/B0/{SECRET}"
        job_url = f"{job_hook.url}?token={SECRET}"
        webhook(api, "vision", team_url, ["start"])
        j = submit(api, "vision", spec("a", notify={"url": job_url,
                                                    "events": ["start"]})).json()
        api.tick()
        api.deliver()                                     # the job's URL: given up (400)
        team_hook.wait(1)
        job_id = j["id"]
        reads = [("GET", "/api/v1/teams"), ("GET", "/api/v1/jobs"),
                 ("GET", f"/api/v1/jobs/{job_id}"), ("GET", "/api/v1/queue?all=true"),
                 ("GET", f"/api/v1/jobs/{job_id}/explain"),
                 ("GET", f"/api/v1/jobs/{job_id}/notifications"),
                 ("GET", f"/api/v1/jobs/{job_id}/wait?timeout=0")]

        def read(who: str) -> str:
            answers = [api.request(m, path, headers=auth(api, who)) for m, path in reads]
            answers.append(api.post("/api/v1/jobs/wait", headers=auth(api, who),
                                    json={"ids": [job_id], "timeout": 0}))
            assert all(r.status_code == 200 for r in answers)
            return "\n".join(r.text for r in answers)

        seen = read("nlp")
        assert SECRET not in seen
        assert f"http://127.0.0.1:{team_hook.port}/…" in seen
        assert f"http://127.0.0.1:{job_hook.port}/…" in seen
        got = api.get(f"/api/v1/jobs/{job_id}", headers=auth(api, "nlp")).json()
        assert got["spec"]["notify"] == {"url": f"http://127.0.0.1:{job_hook.port}/…",
                                         "events": ["start"]}
        for who in ("vision", "admin"):                     # the owner, an admin: whole
            seen = read(who)
            assert team_url in seen and job_url in seen
        assert job_url in api.get("/api/v1/notifications",
                                  headers=auth(api, "admin")).text
    finally:
        team_hook.stop()
        job_hook.stop()


def docs_verify():
    """The receiver's check as docs/notifications.md shows it (its python block)."""
    page = (REPO / "docs" / "notifications.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "def verify" in b]
    namespace: dict = {}
    exec(code, namespace)                # noqa: S102 - the docs' own example
    return namespace["verify"]


def test_a_request_signed_for_one_url_does_not_verify_at_another(api):
    first, second = Receiver().start(), Receiver().start()
    try:
        secret = webhook(api, "vision", first.url, ["start"])
        submit(api, "vision", spec("a", notify={"url": second.url + "/x?k=1",
                                                "events": ["start"]}))
        api.tick()
        api.deliver()
        first.wait(1)
        second.wait(1)
        assert first.signed_with(secret) == [True] and second.signed_with(secret) == [True]
        (headers, body), = first.got
        header = headers["x-airflow-gpu-signature"]
        # replayed as it came: to the other receiver, it does not verify there
        httpx.post(second.url + "/x?k=1", content=body, headers={
            "X-Airflow-GPU-Signature": header, "Content-Type": "application/json"})
        second.wait(2)
        assert second.signed_with(secret) == [True, False]
        for check in (verify, docs_verify()):
            assert check(secret, header, body, first.url)
            assert not check(secret, header, body, second.url + "/x?k=1")
            assert not check(secret, header, body + b" ", first.url)
            assert not check(secret + "x", header, body, first.url)
    finally:
        first.stop()
        second.stop()
