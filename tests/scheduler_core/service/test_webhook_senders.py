"""Webhook senders against hostile receivers on loopback, through the real app and store
(SQLite and PostgreSQL): a receiver that dribbles its answer a byte at a time is cut at
the attempt's deadline and retried; one team's many slow receivers leave senders free
for another team's; an answer of 64 MiB is read a few KiB and dropped."""

from __future__ import annotations

import threading

import pytest

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service import webhooks
from airflow_gpu.scheduler_core.service.webhooks import Deliveries
from tests.databases import serve
from tests.helpers import until
from tests.scheduler_core.api.test_api import auth, submit
from tests.scheduler_core.service.test_notifications import ALLOWED, set_team, spec, webhook
from tests.webhooks import BigAnswer, Dribbler, Receiver

DEADLINE = 2          # seconds an attempt may take (notifications.timeout)


def policy(timeout: float) -> PolicyConfig:
    return PolicyConfig.model_validate({"notifications": {
        "allowed_urls": [ALLOWED], "retry_first": 30, "retry_max": 30,
        "timeout": timeout}})


@pytest.fixture
def api(db_url):
    yield from serve(db_url, policy(DEADLINE))


@pytest.fixture
def patient_api(db_url):
    """Attempts of 8 s: long enough that none of them ends during the test's look."""
    yield from serve(db_url, policy(8))


def notifications(api, job_id: str, team: str = "vision") -> list[dict]:
    return api.get(f"/api/v1/jobs/{job_id}/notifications", headers=auth(api, team)).json()


def test_a_receiver_that_dribbles_its_answer_is_cut_at_the_attempts_deadline(api):
    drip = Dribbler(every=0.2)           # each read gets a byte well within the timeout
    try:
        webhook(api, "vision", drip.url, ["start"])
        j = submit(api, "vision", spec("a")).json()
        api.tick()
        sending = threading.Thread(target=api.deliver, daemon=True)
        sending.start()
        sending.join(timeout=DEADLINE + 20)        # the deadline and ample slack
        assert not sending.is_alive(), "the attempt outlived its deadline"
        (n,) = notifications(api, j["id"])
        assert (n["state"], n["attempts"]) == ("pending", 1)   # retried later
        assert n["last_error"] == (f"ReadTimeout: no answer within the attempt's "
                                   f"{DEADLINE} s (notifications.timeout)")
        assert drip.accepted == 1
    finally:
        drip.stop()


def test_one_teams_slow_receivers_leave_senders_free_for_another_teams(patient_api):
    api, drips, hook = patient_api, [Dribbler() for _ in range(10)], Receiver().start()
    stop = threading.Event()
    deliveries = Deliveries(api.service, lambda: True, lambda session: None)
    try:
        assert set_team(api, "vision", {"webhook_secret": "new"}).status_code == 200
        webhook(api, "nlp", hook.url, ["start"])
        for t in deliveries.threads(stop):
            t.start()
        vision = [submit(api, "vision", spec(f"v{i}", notify={
            "url": d.url, "events": ["start"]})).json()["id"] for i, d in enumerate(drips)]
        assert len(api.tick()) == 10
        until(lambda: sum(d.accepted for d in drips) >= 2, "vision's receivers dribbling")
        nlp = submit(api, "nlp", spec("n")).json()         # while they hold their senders
        assert api.tick() == [nlp["id"]]
        (told,) = hook.wait(1, timeout=30)
        assert told["job"]["id"] == nlp["id"]
        # vision's slow receivers had at most their team's senders, and none has been
        # given up on yet: nlp did not wait for their deadlines
        assert sum(d.accepted for d in drips) <= webhooks.PER_TEAM
        assert all(n["attempts"] == 0 for j in vision for n in notifications(api, j))
    finally:
        stop.set()
        api.service.notified.set()
        for d in drips:
            d.stop()
        hook.stop()
        deliveries.close()


def test_an_answer_of_64_mib_is_read_a_few_kib_and_dropped(api):
    big = BigAnswer(64 * 2**20)
    try:
        webhook(api, "vision", big.url, ["start"])
        j = submit(api, "vision", spec("a")).json()
        api.tick()
        api.deliver()
        (n,) = notifications(api, j["id"])
        assert (n["state"], n["attempts"]) == ("delivered", 1)
        until(lambda: big.accepted == 1 and big.open == 0, "the connection closed")
        # what the sockets' buffers took, no more: the sender read a few KiB of it
        assert big.sent < 16 * 2**20, f"{big.sent} bytes of the answer were taken"
    finally:
        big.stop()
