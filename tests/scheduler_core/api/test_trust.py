"""One bad value never stops the scheduler, and deployments sharing a PostgreSQL database
do not block each other. The real app on its real store (SQLite and PostgreSQL), and
real `airflow-gpu server` processes for the deployments: team settings bounded, a team or
job with bad stored data surfaced on it while the rest is scheduled, a full or read-only
database answering 503 with Retry-After and /healthz saying why passes fail, the leader
lock per deployment with /healthz naming who holds it."""

from __future__ import annotations

import logging
import time
import uuid

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text, update

from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.service import health
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.service.leadership import lock_key
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from airflow_gpu.scheduler_core.store.models import JobRow, TeamRow
from tests.databases import HOSTS, PG_ADMIN, _drop_pg_schema, _pg_schema_url
from tests.helpers import make_cluster, until
from tests.servers import Server


def spec(name: str, gpus: int, **fields) -> dict:
    return {"name": name, "expected_runtime": "1h", "roles": [{"name": "w", "gpus": gpus}],
            **fields}


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submit(api, team: str, body: dict) -> dict:
    r = api.post("/api/v1/jobs", json={"spec": body}, headers=auth(api, team))
    assert r.status_code == 201, r.text
    return r.json()


def job(api, job_id: str) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}", headers=auth(api, "admin")).json()


def events(api, job_id: str) -> list[dict]:
    r = api.get(f"/api/v1/jobs/{job_id}/explain", headers=auth(api, "admin"))
    return r.json()["events"]


def pass_errors(api, kind: str) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith(f'airflow_gpu_pass_errors_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no airflow_gpu_pass_errors_total for {kind}")



# -- point 8: one bad value never stops the scheduler ------------------------------------

@pytest.mark.parametrize("body", [{"share": 5e-324}, {"share": 0}, {"share": -1},
                                  {"share": 1e-4}, {"share": 2e6}, {"share": 1e308},
                                  {"quota_gpus": -1}, {"quota_gpus": 2_000_000}])
def test_team_settings_out_of_bounds_are_refused(api, body):
    r = api.put("/api/v1/teams/vision", json=body, headers=auth(api, "admin"))
    assert r.status_code == 422, r.text
    detail = str(r.json()["detail"])
    assert ("0.001 to 1000000" in detail) if "share" in body else ("0 to 1000000" in detail)
    teams = api.get("/api/v1/teams", headers=auth(api, "admin")).json()
    assert all(t["share"] == 1.0 and t["quota_gpus"] is None for t in teams)


def test_team_settings_at_their_bounds_are_taken(api):
    for body in ({"share": 1e-3, "quota_gpus": 0}, {"share": 1e6, "quota_gpus": 1_000_000}):
        r = api.put("/api/v1/teams/vision", json=body, headers=auth(api, "admin"))
        assert r.status_code == 200, r.text
        assert (r.json()["share"], r.json()["quota_gpus"]) == (body["share"],
                                                              body["quota_gpus"])


def test_a_denormal_share_does_not_stop_scheduling(api):
    """The issue's case: a team with usage gets share 5e-324. The API refuses it; a row
    stored anyway (by an older version, by hand) is reported on the team and its jobs
    while every team, that one too, keeps being scheduled with the policy file's share."""
    running = submit(api, "vision", spec("running", 8))
    assert api.tick() == [running["id"]]
    r = api.put("/api/v1/teams/vision", json={"share": 5e-324}, headers=auth(api, "admin"))
    assert r.status_code == 422, r.text
    with api.service.sessions.begin() as s:      # stored anyway, bypassing the API
        s.add(TeamRow(name="vision", share=5e-324, quota_gpus=None))
    api.service._policy_cache = None             # read at once, not within the second
    before = pass_errors(api, "team")
    waiting = submit(api, "vision", spec("waiting", 2))
    other = submit(api, "nlp", spec("other", 2))
    admitted = api.tick()
    assert sorted(admitted) == sorted([waiting["id"], other["id"]])
    teams = {t["name"]: t for t in api.get("/api/v1/teams", headers=auth(api, "admin")).json()}
    error = teams["vision"]["error"]
    assert error and "team vision: its stored setting is refused" in error
    assert "0.001 to 1000000" in error and "airflow-gpu team-set vision" in error
    assert teams["vision"]["share"] == 1.0 and teams["nlp"]["error"] is None
    assert pass_errors(api, "team") == before + 1
    # told once, not every pass
    later = submit(api, "vision", spec("later", 1))
    assert api.tick() == [later["id"]]
    assert [e["kind"] for e in events(api, later["id"])].count("error") == 0
    assert pass_errors(api, "team") == before + 2       # counted per pass that met it
    # an admin sets it again: the error goes
    r = api.put("/api/v1/teams/vision", json={"share": 2}, headers=auth(api, "admin"))
    assert r.status_code == 200 and r.json()["error"] is None, r.text
    api.tick()
    teams = {t["name"]: t for t in api.get("/api/v1/teams", headers=auth(api, "admin")).json()}
    assert teams["vision"]["error"] is None and teams["vision"]["share"] == 2.0


def test_a_bad_team_setting_is_told_on_its_pending_jobs(api):
    blocker = submit(api, "nlp", spec("blocker", 8))
    assert api.tick() == [blocker["id"]]
    big = submit(api, "vision", {"name": "big", "expected_runtime": "1h",
                                 "roles": [{"name": "w", "replicas": 2, "gpus": 8}]})
    with api.service.sessions.begin() as s:
        s.add(TeamRow(name="vision", share=float("inf"), quota_gpus=-3))
    api.service._policy_cache = None
    assert api.tick() == []                  # big waits for GPUs, not for an error
    got = job(api, big["id"])
    assert got["state"] == "pending" and got["pending"]["code"] != "Error"
    told = [e for e in events(api, big["id"]) if e["kind"] == "error"]
    assert len(told) == 1 and "team vision: its stored setting is refused" in told[0]["message"]
    assert "share:" in told[0]["message"] and "quota_gpus:" in told[0]["message"]
    api.tick()
    assert len([e for e in events(api, big["id"]) if e["kind"] == "error"]) == 1


def _break_spec(api, job_id: str, spec: dict) -> None:
    with api.service.sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(spec=spec))


def test_a_pending_job_with_a_bad_spec_waits_with_its_error_and_the_rest_is_scheduled(api):
    """A spec the pass cannot read (stored by an older version, say): that job stays
    pending with reason Error and an event, the metric counts it, the others start."""
    bad = submit(api, "vision", spec("bad", 1))
    good = submit(api, "vision", spec("good", 1))
    other = submit(api, "nlp", spec("other", 8))
    _break_spec(api, bad["id"], {"name": "bad", "expected_runtime": "1h",
                                 "roles": [{"name": "w", "gpus": "many"}]})
    before = pass_errors(api, "job")
    assert sorted(api.tick()) == sorted([good["id"], other["id"]])
    got = job(api, bad["id"])
    assert got["state"] == "pending" and got["pending"]["code"] == "Error", got
    reason = got["pending"]["reason"]
    assert "the scheduler cannot consider this job" in reason
    assert "ValidationError" in reason and "cancel it and submit it again" in reason
    told = [e for e in events(api, bad["id"]) if e["kind"] == "error"]
    assert len(told) == 1 and told[0]["message"] == reason
    assert pass_errors(api, "job") == before + 1
    # tried again each pass, told once; the cluster keeps being scheduled
    late = submit(api, "nlp", spec("late", 1))
    assert api.tick() == [late["id"]]
    assert len([e for e in events(api, bad["id"]) if e["kind"] == "error"]) == 1
    assert pass_errors(api, "job") == before + 2
    r = api.delete(f"/api/v1/jobs/{bad['id']}", headers=auth(api, "vision"))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_a_running_job_with_a_bad_spec_keeps_its_hosts_and_the_rest_is_scheduled(api):
    held = submit(api, "vision", spec("held", 8))
    assert api.tick() == [held["id"]]
    host = job(api, held["id"])["replicas"][0]["host"]
    _break_spec(api, held["id"], {"roles": "garbage"})
    a = submit(api, "nlp", spec("a", 8))
    assert api.tick() == [a["id"]]
    assert job(api, a["id"])["replicas"][0]["host"] != host
    b = submit(api, "nlp", spec("b", 1))
    assert api.tick() == []                   # none on the held job's host meanwhile
    told = [e for e in events(api, held["id"]) if e["kind"] == "error"]
    assert len(told) == 1 and "cannot rebuild this running job" in told[0]["message"]
    assert host in told[0]["message"]
    assert job(api, b["id"])["state"] == "pending"
    r = api.post(f"/api/v1/jobs/{held['id']}/finish", json={"outcome": "succeeded"},
                 headers=auth(api, "vision"))
    assert r.status_code == 200, r.text
    assert api.tick() == [b["id"]]


# -- point 8: a database that cannot write: 503 with Retry-After, /healthz says why ----------

@pytest.fixture
def live(db_url):
    """The app with its scheduling loop running (interval 0.1s); `break_db()` makes its
    database refuse writes the way a full disk (SQLite) or a read-only standby
    (PostgreSQL) does."""
    service = Service(Settings(db_url, make_cluster(*HOSTS), lease_ttl=2, pass_interval=0.1))
    app = create_app(service)
    tokens = {"vision": create_token(service.sessions, "vision"),
              "admin": create_token(service.sessions, "ops", admin=True)}

    def break_db(read_only: bool = False) -> str:
        engine = service.engine
        if engine.dialect.name == "sqlite" and read_only:
            @event.listens_for(engine, "connect")
            def no_writes(dbapi_conn, _):     # even in place, as a read-only file
                dbapi_conn.execute("PRAGMA query_only = ON")
            broken = "it is read-only"
        elif engine.dialect.name == "sqlite":
            with engine.connect() as conn:
                pages = conn.execute(text("PRAGMA page_count")).scalar()

            @event.listens_for(engine, "connect")
            def full(dbapi_conn, _):          # the file cannot grow: "disk is full"
                dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")
            broken = "its disk is full"
        else:
            @event.listens_for(engine, "connect")
            def read_only(dbapi_conn, _):     # as a standby after a failover
                with dbapi_conn.cursor() as cur:
                    cur.execute("SET default_transaction_read_only = on")
                dbapi_conn.commit()
            broken = "it is read-only"
        engine.dispose()
        return broken

    with TestClient(app, raise_server_exceptions=False) as client:
        client.tokens, client.service, client.loop = tokens, service, app.state.loop
        client.break_db = break_db
        yield client
    service.engine.dispose()


def test_a_database_that_cannot_write_answers_503_and_healthz_says_why(live, caplog):
    first = submit(live, "vision", spec("first", 1))
    until(lambda: job(live, first["id"])["state"] == "admitted", "the loop schedules")
    assert live.get("/healthz").json().get("last_pass_error") is None
    broken = live.break_db()
    with caplog.at_level(logging.WARNING, logger="airflow_gpu.scheduler_core.service.loop"):
        refused = None
        for i in range(300):                  # until the file has no room left
            r = live.post("/api/v1/jobs", json={"spec": spec(f"j{i}-" + "x" * 190, 1)},
                          headers=auth(live, "vision"))
            assert r.status_code in (201, 503), r.text
            if r.status_code == 503:
                refused = r
                break
        assert refused is not None, "the database never refused a write"
        assert int(refused.headers["Retry-After"]) == health.RETRY_AFTER
        detail = refused.json()["detail"]
        assert broken in detail and "nothing was changed, retry after that" in detail
        r = live.post(f"/api/v1/jobs/{first['id']}/heartbeat", headers=auth(live, "vision"))
        if broken == "it is read-only":      # a full file can still update in place
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
        # passes fail too: /healthz says why, then warns once they have stopped for a
        # while. A full SQLite file still takes writes that fit in its pages, and passes
        # run as soon as jobs arrive, so their writes may all have fitted: read-only now
        broken = live.break_db(read_only=True)
        report = until(lambda: (h := live.get("/healthz").json())["warning"] and h,
                       "/healthz warns", timeout=20)
        assert broken in report["last_pass_error"]["message"]
        assert report["status"] == "ok"
        assert "no scheduling pass has completed for" in report["warning"]
        assert broken in report["warning"]
        assert report["seconds_since_last_pass"] > health.WARN_AFTER * 0.6
        assert pass_errors(live, "pass") >= 1
        until(lambda: any("no scheduling pass has completed" in r.getMessage()
                          for r in caplog.records), "the warning is logged")
    # reads still work meanwhile
    assert live.get(f"/api/v1/jobs/{first['id']}", headers=auth(live, "vision")).status_code \
        == 200


def test_only_a_database_that_cannot_store_is_a_503():
    """503 is for a database that cannot store; any other database error is a fault of
    the service and stays a 500 (with its traceback logged)."""
    from sqlalchemy.exc import DBAPIError

    assert health.storage_problem(DBAPIError("SELECT 1", {}, Exception("syntax error"))) \
        is None
    assert health.storage_problem(DBAPIError("INSERT", {}, Exception(
        "database or disk is full"))) is not None


def test_healthz_warns_when_the_leaders_passes_stop(db_url, caplog):
    """A loop that leads but whose last pass is a few intervals old (stuck in a pass, say)
    is reported on /healthz and in the log; a fresh one is not."""
    service = Service(Settings(db_url, make_cluster(*HOSTS), pass_interval=0.5))
    app = create_app(service, run_loop=False)
    loop = app.state.loop
    try:
        assert loop._lead()
        loop.started_at = time.time()
        loop.tick()
        now = loop.last_pass_at
        fresh = health.report(loop, now=now + 1)
        assert fresh["warning"] is None and fresh["scheduling"] is True
        # 3 rounds: the interval, the gathering and the pass itself (slow on a loaded machine)
        limit = 3 * (0.5 + loop.MAX_COALESCE + loop.last_pass)
        quiet = max(10, int(limit) + 2)
        with caplog.at_level(logging.WARNING, logger="airflow_gpu.scheduler_core.service.loop"):
            late = health.report(loop, now=now + quiet)
        assert late["seconds_since_last_pass"] == quiet
        assert late["warning"].startswith(
            f"no scheduling pass has completed for {quiet:.1f}s (over 3 rounds of the 0.5s "
            f"interval: {limit:.1f}s)")
        assert "this replica leads; its loop may be stuck" in late["warning"]
        assert any(f"no scheduling pass has completed for {quiet:.1f}s" in r.getMessage()
                   for r in caplog.records)
    finally:
        loop.stop()
        service.engine.dispose()


# -- point 7: deployments sharing a PostgreSQL database -------------------------------------

@pytest.fixture
def schemas(tmp_path):
    """Two deployments' schemas in one PostgreSQL database, each with its tables and a
    token; `start(i, *args)` starts an `airflow-gpu server` on schema i."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "shared", "hosts": list(HOSTS)}))
    made = [_pg_schema_url() for _ in range(2)]
    tokens = []
    for _, url in made:
        engine = make_engine(url)
        upgrade(engine)
        tokens.append(create_token(sessions(engine), "vision"))
        engine.dispose()
    servers: list[Server] = []

    def start(i: int, *args: str) -> Server:
        servers.append(Server(made[i][1], cluster, log=tmp_path / f"server-{len(servers)}.log",
                              args=args))
        return servers[-1]

    try:
        yield {"names": [m[0] for m in made], "tokens": tokens, "start": start}
    finally:
        for s in servers:
            s.stop()
        for schema, _ in made:
            _drop_pg_schema(schema)


def _admitted(server: Server, token: str, name: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{server.url}/api/v1/jobs", json={"spec": spec(name, 1)}, headers=headers)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    until(lambda: httpx.get(f"{server.url}/api/v1/jobs/{job_id}", headers=headers)
          .json()["state"] == "admitted", f"{name} was not admitted on {server.db}")


def test_deployments_in_two_schemas_both_schedule_and_healthz_names_the_holder(schemas):
    a1, a2 = (schemas["start"](0, "--log-level", "info") for _ in range(2))
    b = schemas["start"](1)
    until(lambda: [a1.healthy()["scheduling"], a2.healthy()["scheduling"]].count(True) == 1,
          "one replica of deployment a schedules")
    until(lambda: b.healthy()["scheduling"], "deployment b schedules too")
    _admitted(a1, schemas["tokens"][0], "in-a")
    _admitted(b, schemas["tokens"][1], "in-b")
    leader, other = (a1, a2) if a1.healthy()["scheduling"] else (a2, a1)
    ha, hb = leader.healthy(), b.healthy()
    assert ha["deployment"] == f"schema {schemas['names'][0]}"
    assert hb["deployment"] == f"schema {schemas['names'][1]}"
    assert ha["lock_key"] == lock_key(ha["deployment"]) != hb["lock_key"]
    assert ha["leader"]["this_replica"] is True and ha["leader"]["pid"]
    assert f"pid {leader.proc.pid}" in ha["leader"]["application_name"]
    assert ha["warning"] is None and ha["seconds_since_last_pass"] < 5
    # the replica that waits names the one that holds the lock
    ho = until(lambda: (h := other.healthy())["leader"] and h, "the waiting replica "
               "sees the holder")
    assert ho["scheduling"] is False and ho["deployment"] == ha["deployment"]
    assert ho["leader"]["this_replica"] is False
    assert ho["leader"]["pid"] == ha["leader"]["pid"]
    assert ho["leader"]["application_name"] == ha["leader"]["application_name"]
    assert ho["leader"]["backend_start"] and ho["warning"] is None
    assert f"schema {schemas['names'][0]}: this replica schedules now (advisory lock key " \
        f"{ha['lock_key']}, backend pid {ha['leader']['pid']}" in leader.log.read_text()
    log = other.log.read_text()
    assert f"advisory lock key {ha['lock_key']} is held by backend pid {ha['leader']['pid']}" \
        in log and f"pid {leader.proc.pid}" in log


def test_a_configured_deployment_name_keys_the_lock(schemas, monkeypatch):
    """--deployment (or AIRFLOW_GPU_DEPLOYMENT) names the lock: replicas given the same
    name share one scheduler, whatever schema they use."""
    blue = schemas["start"](0, "--deployment", "blue")
    h = until(lambda: (h := blue.healthy())["scheduling"] and h, "blue schedules")
    assert h["deployment"] == "deployment blue" and h["lock_key"] == lock_key("deployment blue")
    monkeypatch.setenv("AIRFLOW_GPU_DEPLOYMENT", "blue")
    again = schemas["start"](1)                  # the name from the environment
    h2 = until(lambda: (h := again.healthy())["leader"] and h, "the holder is seen")
    assert h2["deployment"] == "deployment blue" and h2["scheduling"] is False
    assert h2["leader"]["pid"] == h["leader"]["pid"]
    _admitted(blue, schemas["tokens"][0], "blue-job")


def test_a_replica_names_any_holder_of_its_lock_and_takes_over_when_it_frees(schemas):
    """Whoever holds the deployment's lock (here not a scheduler at all) is named by its
    application_name; no warning then (the holder's /healthz speaks for it), and the
    replica schedules as soon as the lock frees."""
    holder = create_engine(PG_ADMIN)
    deployment = f"schema {schemas['names'][0]}"
    conn = holder.connect()
    try:
        conn.execute(text("SET application_name = 'something else'"))
        assert conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                            {"k": lock_key(deployment)}).scalar()
        conn.commit()
        s = schemas["start"](0)
        h = until(lambda: (h := s.healthy())["leader"] and h, "the holder is seen")
        assert h["scheduling"] is False and h["leader"]["application_name"] == "something else"
        assert h["warning"] is None       # someone holds it: their /healthz speaks for them
    finally:
        conn.close()
        holder.dispose()
    until(lambda: s.healthy()["scheduling"], "it takes over once the lock is free")
    _admitted(s, schemas["tokens"][0], f"x-{uuid.uuid4().hex[:6]}")
