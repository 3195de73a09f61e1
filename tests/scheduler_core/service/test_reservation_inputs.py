"""Reservations' and specs' slips through the real app and store (SQLite and PostgreSQL):
a huge host range, a host or team named twice, a start in year 9999, an empty GPU model,
repeated array indexes and webhook events are refused naming the field, the value and
the fix (422, never 500, nothing made); `acct --by reservation` keeps a reservation that
was deleted after its start; and two replicas making overlapping reservations at the
same instant: exactly one wins each round."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.common import Principal
from airflow_gpu.scheduler_core.service.core import Service, Settings
from tests.databases import serve
from tests.helpers import make_cluster

HOSTS = ({"name": "dgx-[1-4]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
ADMIN = Principal("ops", admin=True)


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


@pytest.fixture
def api(db_url):
    policy = PolicyConfig.model_validate({"notifications": {
        "allowed_urls": ["http://127.0.0.1:"]}})
    yield from serve(db_url, policy, hosts=HOSTS)


def refused(r, *says: str) -> str:
    """A 422 whose message (a body's field errors: `spec.array.range: ...`) says each."""
    assert r.status_code == 422, (r.status_code, r.text)
    detail = r.json()["detail"]
    if isinstance(detail, list):
        detail = "; ".join(".".join(map(str, e["loc"][1:])) + ": " + e["msg"]
                           for e in detail)
    for text in says:
        assert text in detail, (text, detail)
    return detail


BAD = [  # (body, what the refusal says: the field, the value, the fix)
    ({"hosts": "dgx-a-[01-9999999]"}, ["hosts: ", "'dgx-a-[01-9999999]'", "9,999,999",
                                        "split it"]),
    ({"hosts": "dgx-[1-2],dgx-2"}, ["hosts: dgx-2 is named twice, in 'dgx-[1-2],dgx-2'",
                                     "name each host once"]),
    ({"hosts": ["dgx-[1-2]", "dgx-2"]}, ["hosts: dgx-2 is named twice, in 'dgx-[1-2]' and "
                                         "in 'dgx-2'"]),
    ({"hosts": ["dgx-1", "dgx-1"]}, ["hosts: dgx-1 is named twice", "name each host once"]),
    ({"hosts": "dgx-3", "maint": False, "teams": ["vision", "vision"]},
     ["teams: 'vision' is named twice", "name each team once"]),
    ({"start": "9999-01-01T00:00"}, ["start: 9999-01-01T00:00:00+00:00 is more than 730d "
                                     "ahead", "the latest a reservation may start",
                                     "check the year"]),
    ({"start": "9999-12-31T23:00", "duration": "4h"}, ["start: 9999-12-31T23:00:00+00:00",
                                                       "730d ahead"]),
    ({"start": "now+1000d"}, ["start: ", "730d ahead"]),
    ({"hosts": None, "gpus": 8, "gpu_model": ""}, ["gpu_model: '' names no GPU model",
                                                   "A100", "leave it out"]),
    ({"gpu_model": "A100"}, ["gpu_model: 'A100'", "give it with gpus"]),
]


def test_slips_in_a_new_reservation_are_refused_naming_field_value_and_fix(api):
    for change, says in BAD:
        body = {"name": "slip", "hosts": "dgx-1", "duration": "1h", "maint": True, **change}
        r = api.post("/api/v1/reservations", headers=auth(api, "admin"),
                     json={k: v for k, v in body.items() if v is not None})
        refused(r, *says)
    assert api.get("/api/v1/reservations", headers=auth(api, "admin")).json() == []
    # the same checks when one is changed; and a start within two years is fine
    made = api.post("/api/v1/reservations", headers=auth(api, "admin"), json={
        "name": "far", "hosts": "dgx-1", "start": "now+700d", "duration": "1h",
        "maint": True})
    assert made.status_code == 201, made.text
    for change, says in [({"hosts": "dgx-[1-9999999]"}, ["hosts: ", "9,999,999"]),
                         ({"hosts": "dgx-1,dgx-1"}, ["hosts: dgx-1 is named twice"]),
                         ({"start": "9999-01-01T00:00"}, ["start: ", "730d ahead"])]:
        r = api.patch("/api/v1/reservations/far", headers=auth(api, "admin"), json=change)
        refused(r, *says)
    assert [(r["name"], r["hosts"]) for r in api.get(
        "/api/v1/reservations", headers=auth(api, "admin")).json()] == [("far", ["dgx-1"])]


def test_repeated_array_indexes_and_webhook_events_are_refused(api):
    base = {"name": "arr", "roles": [{"name": "w", "gpus": 1}], "expected_runtime": "1h"}
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"),
                 json={"spec": {**base, "array": "0,0,0"}})
    refused(r, "array.range", "index 0 is given more than once in '0,0,0'",
            "give each index once, e.g. 0")
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"),
                 json={"spec": {**base, "array": "0-9,5-15%2"}})
    refused(r, "index 5 is given more than once", "e.g. 0-15")
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"), json={"spec": {
        **base, "notify": {"url": "http://127.0.0.1:9/hook", "events": ["start", "start"]}}})
    refused(r, "notify.events", "'start' is given twice", "give each event once")
    r = api.put("/api/v1/teams/vision", headers=auth(api, "admin"), json={
        "webhook_url": "http://127.0.0.1:9/hook", "webhook_events": ["end", "end"]})
    refused(r, "webhook_events", "'end' is given twice")
    assert api.get("/api/v1/jobs", headers=auth(api, "vision")).json() == []
    # a spec stored before the rule (indexes repeated) still reads: it is no new one
    stored = JobSpec.model_validate({**base, "array": "0,0,0"})
    assert stored.array.indexes == [0]


def acct_rows(api) -> list[tuple]:
    r = api.get("/api/v1/accounting", headers=auth(api, "vision"),
                params={"by": "reservation"})
    assert r.status_code == 200, r.text
    return [(x["reservation"], x["state"], x["hosts"], x["jobs"]) for x in r.json()["rows"]]


def test_accounting_by_reservation_keeps_a_deleted_one(api):
    def reserve(**body):
        r = api.post("/api/v1/reservations", headers=auth(api, "admin"), json=body)
        assert r.status_code == 201, r.text

    reserve(name="vis", hosts="dgx-1", duration="1h", teams=["vision"])
    reserve(name="fw", hosts="dgx-2", duration="1h", maint=True)
    reserve(name="later", hosts="dgx-3", start="now+1h", duration="1h", maint=True)
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"), json={"spec": {
        "name": "in", "reservation": "vis", "expected_runtime": "30m",
        "roles": [{"name": "w", "gpus": 8}]}})
    assert r.status_code == 201, r.text
    api.tick()
    got = api.get(f"/api/v1/jobs/{r.json()['id']}", headers=auth(api, "vision")).json()
    assert got["state"] == "admitted", got
    for name in ("vis", "fw", "later"):
        assert api.delete(f"/api/v1/reservations/{name}",
                          headers=auth(api, "admin")).status_code == 200
    reserve(name="vis", hosts="dgx-4", duration="1h", teams=["vision"])   # the name again
    rows = acct_rows(api)
    # the deleted ones that had started, to their deletion, with their jobs; the new
    # `vis` has none of the old one's; `later` never started: it held nothing
    assert sorted(rows) == [("fw", "deleted", ["dgx-2"], 0),
                            ("vis", "active", ["dgx-4"], 0),
                            ("vis", "deleted", ["dgx-1"], 1)], rows
    report = api.get("/api/v1/accounting", headers=auth(api, "vision"),
                     params={"by": "reservation", "team": "vision"}).json()["rows"]
    old = next(x for x in report if x["state"] == "deleted")
    assert old["reserved_gpu_hours"] >= old["used_gpu_hours"] >= 0
    assert datetime.fromisoformat(old["end"]) <= datetime.now(UTC)   # to its deletion


def _make(svc: Service, gate: threading.Barrier, name: str, start: str) -> str:
    """One replica's try, started with the other's: made, refused (overlap), or what
    went wrong."""
    gate.wait()
    try:
        svc.create_reservation(ADMIN, name=name, start=start, duration=3600, hosts="dgx-1",
                               maint=True)
        return "made"
    except InputError as exc:
        return "overlap" if "which this one would overlap" in str(exc) else str(exc)
    except Exception as exc:  # noqa: BLE001 - any other outcome fails the round
        return repr(exc)


def test_two_replicas_never_both_make_overlapping_reservations(db_url):
    """Each round, two services on one database make reservations of the same host for
    the same hour at the same instant: exactly one is made, the other is refused with
    the overlap (a read-then-write would let both through)."""
    replicas = [Service(Settings(db_url, make_cluster(*HOSTS), PolicyConfig(), lease_ttl=30))
                for _ in range(2)]
    rounds, outcomes = 20, []
    try:
        with ThreadPoolExecutor(2) as pool:
            for i in range(rounds):
                start = (datetime.now(UTC) + timedelta(hours=2 * i + 1)).isoformat()
                gate = threading.Barrier(2)
                tries = [pool.submit(_make, svc, gate, f"r{i}-{k}", start)
                         for k, svc in enumerate(replicas)]
                outcomes.append(tuple(sorted(t.result(timeout=30) for t in tries)))
        assert outcomes == [("made", "overlap")] * rounds, outcomes
        assert len(replicas[0].reservations()) == rounds
    finally:
        for svc in replicas:
            svc.engine.dispose()
            if svc.read_engine is not svc.engine:
                svc.read_engine.dispose()
