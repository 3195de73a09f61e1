"""Accounting at scale through the real app and store (SQLite and PostgreSQL): 5,000
grants over ten years, bulk-inserted, reported per day and team and per team with the
sums an independent day-by-day computation gives; a window over the maximum is a 422
naming it; a read past the read limit, or still running at shutdown, is stopped (503
naming what to narrow, not a 500); /metrics answers with 5,000 pending and 5,000
finished jobs. (The time these take is measured by bench/reads.py.)"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert

from airflow_gpu.scheduler_core.engine.mig import gpu_share
from airflow_gpu.scheduler_core.service import readlimit
from airflow_gpu.scheduler_core.store.models import AllocationRow, JobRow, UsageRow
from tests.databases import serve
from tests.scheduler_core.api.test_api import auth

UNTIL = datetime(2026, 6, 1, 6, 30, tzinfo=UTC)
SINCE = UNTIL - timedelta(days=3659, hours=20)        # under the 3660-day maximum
TEAMS = ("vision", "nlp", "speech", "ops")
DAY = 86400.0


def populate(service, grants: int = 5000, seed: int = 1, pending: int = 0,
             finished: int = 0) -> list[dict]:
    """Bulk-insert `grants` finished jobs' allocations spread over the ten years before
    UNTIL (a few start before the window or end after it, one in fifty lasts months,
    one in ten has a second replica, one in seven is a MIG device), usage rows for one
    job in five (one of them on a day without a grant), and `pending` + `finished`
    more jobs without grants (for /metrics). Returns the allocations as inserted."""
    rng = random.Random(seed)
    jobs, allocs, usage = [], [], []
    span = (UNTIL - SINCE).total_seconds() + 10 * DAY
    for i in range(grants):
        job_id, team = str(uuid.UUID(int=rng.getrandbits(128))), TEAMS[i % len(TEAMS)]
        start = SINCE - timedelta(days=5) + timedelta(seconds=rng.uniform(0, span))
        long = i % 50 == 0
        length = rng.uniform(30, 400) * DAY if long else rng.uniform(60, 3 * DAY)
        end = start + timedelta(seconds=length)
        jobs.append(_job(job_id, f"j{i}", team, "succeeded", start, end))
        gpus = rng.choice(([0], [0, 1], [0, 1, 2, 3], list(range(8))))
        mig = None
        if i % 7 == 3:
            gpus, mig = [], [{"gpu": 5, "index": 1, "profile": "3g.40gb", "label": "x"}]
        for replica in range(2 if i % 10 == 1 else 1):
            allocs.append({"job_id": job_id, "team": team, "role": "worker",
                           "replica": replica, "host": f"dgx-{1 + replica}", "gpus": gpus,
                           "cpus": [], "memory_by_numa": {}, "nics": [], "mig": mig,
                           "live": False, "granted_at": start, "released_at": end})
        if i % 5 == 0:
            day = start.date()
            for k in range(2):
                usage.append(_usage(job_id, team, (day + timedelta(days=k)).isoformat(),
                                    rng))
            if i % 25 == 0:            # a day of usage without a grant that day
                usage.append(_usage(job_id, team, (end.date() + timedelta(days=3))
                                    .isoformat(), rng))
    now = datetime.now(UTC)
    for i in range(pending + finished):
        state = "pending" if i < pending else "succeeded"
        jobs.append(_job(str(uuid.uuid4()), f"m{i}", TEAMS[i % len(TEAMS)], state,
                         now - timedelta(minutes=5), None if i < pending else now))
    with service.sessions() as s, s.begin():
        for table, rows in ((JobRow, jobs), (AllocationRow, allocs), (UsageRow, usage)):
            rows = [{k: v for k, v in r.items() if k != "team"} if table is AllocationRow
                    else r for r in rows]
            for k in range(0, len(rows), 1000):
                s.execute(insert(table), rows[k:k + 1000])
    return allocs, usage


def _job(job_id, name, team, state, start, end) -> dict:
    return {"id": job_id, "name": name, "team": team, "spec": {}, "state": state,
            "priority": 0, "details": {}, "submitted_at": start, "admitted_at": None
            if state == "pending" else start, "finished_at": end,
            "outcome": None if state == "pending" else "succeeded", "attempt": 1}


def _usage(job_id, team, day, rng) -> dict:
    return {"job_id": job_id, "team": team, "attempt": 1, "role": "worker", "replica": 0,
            "host": "dgx-1", "gpu": 0, "day": day, "sampled_seconds": rng.uniform(0, 9e4),
            "util_seconds": rng.uniform(0, 9e6), "util_peak": rng.uniform(0, 100),
            "memory_peak_bytes": rng.randrange(2**36), "energy_joules": rng.uniform(0, 1e7),
            "zero_seconds": rng.uniform(0, 100)}


def _charged(a) -> float:
    return len(a["gpus"]) + float(sum(gpu_share(m["profile"]) for m in a["mig"] or ()))


def expected(allocs, usage) -> tuple[dict, dict]:
    """Per (day, team) and per team: GPU-seconds, MIG device-seconds, jobs and usage
    sums, walking each grant day by day (the slow, obvious way)."""
    days: dict[tuple, dict] = {}
    teams: dict[str, dict] = {}
    lo_day, hi_day = SINCE.date().isoformat(), UNTIL.date().isoformat()

    def blank():
        return {"gpu": 0.0, "mig": 0.0, "jobs": set(), "energy": 0.0, "peak": None}

    for a in allocs:
        if not (a["granted_at"] < UNTIL and a["released_at"] >= SINCE):
            continue
        t = teams.setdefault(a["team"], blank())
        t["jobs"].add(a["job_id"])
        n, m = _charged(a), len(a["mig"] or ())
        midnight = datetime.combine(max(a["granted_at"], SINCE).date(), datetime.min.time(),
                                    tzinfo=UTC)
        while midnight < min(a["released_at"], UNTIL):
            lo = max(a["granted_at"], SINCE, midnight)
            hi = min(a["released_at"], UNTIL, midnight + timedelta(days=1))
            sec = (hi - lo).total_seconds()
            if sec > 0 and n:
                d = days.setdefault((midnight.date().isoformat(), a["team"]), blank())
                d["gpu"] += sec * n
                d["mig"] += sec * m
                d["jobs"].add(a["job_id"])
                t["gpu"] += sec * n
                t["mig"] += sec * m
            midnight += timedelta(days=1)
    for u in usage:
        if not lo_day <= u["day"] <= hi_day:
            continue
        for acc in (days.setdefault((u["day"], u["team"]), blank()),
                    teams.setdefault(u["team"], blank())):
            acc["energy"] += u["energy_joules"]
            acc["jobs"].add(u["job_id"])
            acc["peak"] = max(acc["peak"] or 0, u["util_peak"])
    return days, teams


@pytest.fixture
def big(db_url):
    for client in serve(db_url):
        client.data = populate(client.service)
        yield client


def _get(api, **params):
    return api.get("/api/v1/accounting", headers=auth(api, "nlp"),
                   params={"since": SINCE.isoformat(), "until": UNTIL.isoformat(), **params})


def _same(row: dict, want: dict) -> None:
    assert row["gpu_seconds"] == pytest.approx(want["gpu"], abs=0.01), row
    assert row["mig_device_hours"] == pytest.approx(want["mig"] / 3600, abs=1e-4), row
    assert row["jobs"] == len(want["jobs"]), row
    assert row["energy_joules"] == pytest.approx(want["energy"], abs=0.01), row
    assert row["utilization_peak"] == (pytest.approx(want["peak"]) if want["peak"]
                                       is not None else None), row


def test_ten_years_of_5000_grants_by_day_and_by_team_equal_a_day_by_day_walk(big):
    days, teams = expected(*big.data)
    r = _get(big, by="day")
    assert r.status_code == 200, r.text
    rows = r.json()["rows"]
    assert [(x["day"], x["team"]) for x in rows] == sorted(days)
    for row in rows:
        _same(row, days[(row["day"], row["team"])])
    r = _get(big, by="team")
    assert r.status_code == 200, r.text
    assert [x["team"] for x in r.json()["rows"]] == sorted(teams)
    for row in r.json()["rows"]:
        _same(row, teams[row["team"]])
    # one team's days: the same rows as that team's in the full report
    one = _get(big, by="day", team="speech").json()["rows"]
    assert one == [x for x in rows if x["team"] == "speech"]


def test_a_report_per_day_over_the_maximum_is_refused_naming_it(big):
    r = _get(big, by="day", since=(UNTIL - timedelta(days=3660, seconds=1)).isoformat())
    assert r.status_code == 422, r.text
    assert "since" in r.text and "at most 3660 days" in r.text
    r = _get(big, by="day", since=(UNTIL - timedelta(days=3660)).isoformat())
    assert r.status_code == 200, r.text


def test_a_report_past_the_read_limit_is_503_naming_what_to_narrow(big, monkeypatch):
    monkeypatch.setenv(readlimit.READ_TIMEOUT_ENV, "0.000001")
    for by in ("day", "team", "job"):
        r = _get(big, by=by)
        assert r.status_code == 503, r.text
        detail = r.json()["detail"]
        assert "read limit" in detail and readlimit.READ_TIMEOUT_ENV in detail, detail
        assert "since" in detail, detail
    monkeypatch.delenv(readlimit.READ_TIMEOUT_ENV)
    assert _get(big, by="day").status_code == 200     # the pooled connection is fine


def _slow_statement(service) -> str:
    if service.engine.dialect.name == "sqlite":
        return ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                "WHERE x < 5000000000) SELECT count(*) FROM c")
    return "SELECT pg_sleep(600)"


def _read_in_thread(service, narrow="since: narrow it") -> tuple[threading.Thread, list]:
    out: list = []

    def read():
        try:
            with readlimit.bounded(service, narrow) as limit:
                limit.session.connection().exec_driver_sql(_slow_statement(service))
            out.append("finished")
        except Exception as e:            # what the read ended with, for the test
            out.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, out


def _until_running(service, t) -> None:
    deadline = time.monotonic() + 60
    while not readlimit._reads(service).live and t.is_alive():
        assert time.monotonic() < deadline, "the read never started"
        time.sleep(0.01)
    time.sleep(0.2)                        # its statement is under way


def test_the_database_stops_a_statement_at_the_read_limit(api, monkeypatch):
    # PostgreSQL's statement_timeout, SQLite's progress handler: the statement itself
    # is stopped (it would run for minutes), as a ReadTooLong, not a driver error
    monkeypatch.setenv(readlimit.READ_TIMEOUT_ENV, "0.3")
    t, out = _read_in_thread(api.service)
    t.join(60)
    assert not t.is_alive(), "the statement was not stopped"
    assert isinstance(out[0], readlimit.ReadTooLong) and not out[0].shutdown, out
    assert "read limit (0.3 s" in str(out[0]) and "since" in str(out[0])


def test_shutdown_stops_reads_in_flight_and_refuses_new_ones(api):
    t, out = _read_in_thread(api.service)
    _until_running(api.service, t)
    readlimit.stop(api.service)
    t.join(60)
    assert not t.is_alive(), "the read still runs after the shutdown"
    assert isinstance(out[0], readlimit.ReadTooLong) and out[0].shutdown, out
    assert "shutting down" in str(out[0])
    r = _get(api, by="team")
    assert r.status_code == 503 and "shutting down" in r.text, r.text


def test_a_termination_signal_stops_reads_before_the_server_waits_for_them(api):
    # uvicorn waits for requests in flight before the app's shutdown: the signal itself
    # stops them, then the server's handler (here a stand-in that records it) runs
    got = []
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, lambda signum, _: got.append(signum))
    try:
        readlimit.stop_on_signals(api.service)
        t, out = _read_in_thread(api.service)
        _until_running(api.service, t)
        os.kill(os.getpid(), signal.SIGTERM)
        t.join(60)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert not t.is_alive() and got == [signal.SIGTERM]
    assert isinstance(out[0], readlimit.ReadTooLong) and out[0].shutdown, out


def test_metrics_answer_with_5000_pending_and_5000_finished_jobs(db_url):
    for api in serve(db_url):
        populate(api.service, grants=0, pending=5000, finished=5000)
        r = api.get("/metrics")
        assert r.status_code == 200, r.text
        for team in TEAMS:
            line = f'airflow_gpu_pending_jobs{{reason="none",team="{team}"}} 1250.0'
            assert line in r.text, line
            assert f'airflow_gpu_jobs{{state="pending",team="{team}"}} 1250.0' in r.text
