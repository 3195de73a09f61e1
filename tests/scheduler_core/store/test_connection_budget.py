"""The PostgreSQL connection budget (docs/service.md, "Connection budget"): `airflow-gpu
server` sizes each process's pool at start-up from the database server's real
max_connections, the replicas (`--replicas`, default 3) and `--workers`, keeps one
connection per process for leadership, and says so in one log line. Three replicas on
defaults fit the server under load and still elect a leader; with every pooled connection
held, the election and the lease renewal still work, and requests answer 503 with
Retry-After. Real servers on the machine's PostgreSQL and on one of their own."""

from __future__ import annotations

import os
import re
import time

import anyio.to_thread
import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.service.loop import SchedulerLoop
from airflow_gpu.scheduler_core.store import budget as budgets
from airflow_gpu.scheduler_core.store.budget import connection_budget
from airflow_gpu.scheduler_core.store.db import (
    POOL_SIZE,
    POOL_SIZE_ENV,
    POOL_TIMEOUT_ENV,
    make_engine,
    sessions,
    upgrade,
)
from tests.databases import HOSTS, PG_ADMIN, _drop_pg_schema, _pg_schema_url
from tests.helpers import make_cluster, until
from tests.scheduler_core.store.test_hardening_store import Load, Postgres
from tests.servers import Server, no_failed_requests


def limits(url: str) -> tuple[int, int]:
    """max_connections and the reserved connections, as psql shows them."""
    engine = create_engine(url)
    with engine.connect() as conn:
        m = int(conn.execute(text("SHOW max_connections")).scalar())
        r = int(conn.execute(text("SHOW superuser_reserved_connections")).scalar())
        if conn.execute(text("SELECT 1 FROM pg_settings WHERE name = "
                             "'reserved_connections'")).scalar():
            r += int(conn.execute(text("SHOW reserved_connections")).scalar())
    engine.dispose()
    return m, r


@pytest.fixture
def pg_schema():
    schema, url = _pg_schema_url()
    try:
        yield url
    finally:
        _drop_pg_schema(schema)


@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"cluster": "c", "hosts": list(HOSTS)}))
    return path


def test_the_budget_is_sized_from_the_servers_max_connections(monkeypatch):
    monkeypatch.delenv(POOL_SIZE_ENV, raising=False)
    m, reserved = limits(PG_ADMIN)
    usable = m - reserved
    engine = make_engine(PG_ADMIN)
    try:
        for replicas, workers in ((3, 1), (1, 1), (2, 3)):
            b = connection_budget(engine, replicas, workers)
            assert (b.max_connections, b.reserved, b.configured) == (m, reserved, False)
            assert b.per_replica == workers * (b.pool + 1)      # one for leadership each
            # the replicas together keep to half of what PostgreSQL allows, and one
            # connection more per process would not
            assert b.total <= usable // 2, b
            assert b.pool == POOL_SIZE or (
                replicas * workers * (b.pool + 2) > usable // 2), b
        b = connection_budget(engine, 3, 1)
        assert b.line().startswith(f"connection budget: {b.pool} for requests, 1 for "
                                   f"leadership, of PostgreSQL's max_connections {m} "
                                   "shared by 3 replicas")
        # --db-pool-size (or its variable) wins; too large for the server: said so
        monkeypatch.setenv(POOL_SIZE_ENV, "40")
        b = connection_budget(engine, 3, 4)
        assert b.configured and b.pool == 40
        assert b.overrun() is None if b.total <= usable else (
            "--db-pool-size: 40 is too large for 3 replicas x 4 worker processes"
            in b.overrun())
        monkeypatch.delenv(POOL_SIZE_ENV)
        with pytest.raises(InputError, match=r"--replicas: 1000 replicas x 1 worker "
                           r"processes leave 0 connection\(s\) per process .* Raise "
                           "max_connections, lower --workers or --replicas, or set "
                           "--db-pool-size"):
            connection_budget(engine, 1000, 1)
    finally:
        engine.dispose()
    for bad, says in (("0", "--replicas: 0 is out of bounds"),
                      ("three", "--replicas: 'three' is not a number of replicas")):
        with pytest.raises(InputError, match=says):
            budgets.replicas_from(bad)


def budget_lines(db_url: str, cluster_file, log, *args: str) -> list[str]:
    """The lines of `airflow-gpu server *args` that say its connection budget."""
    server = Server(db_url, cluster_file, log=log, args=(*args, "--log-level", "info"))
    try:
        until(lambda: "connection budget" in log.read_text(), "the budget's line")
        return [x for x in log.read_text().splitlines() if "connection budget" in x]
    finally:
        server.stop()


def test_the_server_says_its_budget_at_start_up_and_pools_that_many(
        pg_schema, cluster_file, tmp_path, monkeypatch):
    monkeypatch.delenv(POOL_SIZE_ENV, raising=False)
    monkeypatch.delenv(budgets.REPLICAS_ENV, raising=False)
    m, reserved = limits(PG_ADMIN)
    engine = make_engine(PG_ADMIN)
    expected = connection_budget(engine, 2, 1)
    engine.dispose()
    lines = budget_lines(pg_schema, cluster_file, tmp_path / "server.log", "--replicas", "2")
    assert len(lines) == 1, lines
    assert (f"connection budget: {expected.pool} for requests, 1 for leadership, of "
            f"PostgreSQL's max_connections {m} shared by 2 replicas") in lines[0]
    assert f"at most {expected.total} in all of the {m - reserved}" in lines[0]
    assert expected.pool < POOL_SIZE or m > 160       # smaller than before on 100
    # a server without autovacuum is told what that costs (this machine's may have it off)
    with create_engine(PG_ADMIN).connect() as conn:
        off = conn.execute(text("SHOW autovacuum")).scalar() == "off"
    said = "PostgreSQL's autovacuum is off" in (tmp_path / "server.log").read_text()
    assert said == off, (off, said)
    # an explicit pool size is said as such
    lines = budget_lines(pg_schema, cluster_file, tmp_path / "server2.log",
                         "--db-pool-size", "5")
    assert any("connection budget: 5 for requests, 1 for leadership, of PostgreSQL's "
               f"max_connections {m} shared by 3 replicas (set by --db-pool-size)" in x
               for x in lines), lines


@pytest.fixture
def small_postgres():
    pg = Postgres(max_connections=40)
    try:
        yield pg
    finally:
        pg.close()


def test_three_replicas_on_defaults_fit_the_server_and_elect_a_leader(
        small_postgres, cluster_file, tmp_path, monkeypatch):
    """max_connections 40 (37 for roles that are not superusers): three replicas with no
    pool size set under 60 clients; every request succeeds, the connections stay within
    the budget the servers logged, another client still connects, and one replica leads
    while the other two see it (their elections ran)."""
    for name in (POOL_SIZE_ENV, budgets.REPLICAS_ENV):
        monkeypatch.delenv(name, raising=False)
    pg = small_postgres
    engine = make_engine(pg.url)
    upgrade(engine)
    token = create_token(sessions(engine), "vision")
    b = connection_budget(engine, 3, 1)
    engine.dispose()
    logs = [tmp_path / f"s{i}.log" for i in range(3)]
    servers: list[Server] = []
    try:
        for log in logs:
            servers.append(Server(pg.url, cluster_file, log=log,
                                  args=("--log-level", "info")))
        load = Load([s.url for s in servers], token, clients=60)
        try:
            peak, other = pg.watch(5)
        finally:
            load.close()
        # a leader starved of CPU under this load (two cores) may miss a renewal: another
        # replica takes its lease over and the old one learns it at its next renewal.
        # Asked again until they agree, within a few leases
        healths = until(lambda: _agreed([httpx.get(f"{s.url}/healthz", timeout=30).json()
                                         for s in servers]),
                        "one replica leads and the others name it", timeout=30, every=0.5)
    finally:
        for s in servers:
            s.stop()
    results = list(load.results)
    no_failed_requests(results, 200)
    assert all(o == 1 for o in other), [o for o in other if o != 1][:3]
    assert peak <= b.total + 1, (peak, b)       # (+1: this test's own client)
    text_ = "".join(log.read_text() for log in logs)
    assert text_.count(f"connection budget: {b.pool} for requests") == 3, text_[-2000:]
    assert "too many clients" not in text_, text_[-2000:]
    (leader,) = [h for h in healths if h["scheduling"]]
    assert leader["last_pass_error"] is None, leader


def _agreed(healths: list[dict]) -> list[dict] | None:
    """The replicas' /healthz when exactly one leads and every other one names it."""
    leaders = [h for h in healths if h["scheduling"]]
    if len(leaders) != 1:
        return None
    pid = leaders[0]["leader"]["pid"]
    if all(h["scheduling"] or (h["leader"] and h["leader"]["pid"] == pid) for h in healths):
        return healths
    return None


def _service(url: str, pool: int) -> Service:
    return Service(Settings(url, make_cluster(*HOSTS), PolicyConfig(), lease_ttl=30,
                            db_pool_size=pool))


def _expires(url: str) -> float:
    engine = create_engine(url)
    with engine.connect() as conn:
        at = conn.execute(text("SELECT extract(epoch FROM expires_at) FROM "
                               "leader_lease")).scalar()
    engine.dispose()
    return float(at)


def test_leadership_never_waits_for_the_pool(pg_schema, monkeypatch):
    """Every pooled connection of two replicas held: the election still runs (one leads,
    the other sees it), the leader renews its lease, and requests answer 503 with
    Retry-After once the pool's wait is over; released, everything works again."""
    monkeypatch.setenv(POOL_TIMEOUT_ENV, "1")
    a, b = _service(pg_schema, 3), _service(pg_schema, 3)
    assert a.engine.pool.timeout() == 1
    token = create_token(a.sessions, "vision")
    app = create_app(a, run_loop=False)
    loop_b = SchedulerLoop(b)
    held = []
    try:
        with TestClient(app) as client:
            # the API runs two threads fewer than the pool holds: those stay for the
            # scheduling loop's pass and lease checks
            async def threads() -> float:
                return anyio.to_thread.current_default_thread_limiter().total_tokens

            assert client.portal.call(threads) == 1
            for engine in (a.engine, b.engine):
                for _ in range(3):
                    conn = engine.connect()
                    conn.execute(text("SELECT 1"))
                    held.append(conn)
            loop_a = app.state.loop
            assert loop_a._lead() and loop_a.leader and loop_a.token is not None
            assert not loop_b._lead() and loop_b.holder["pid"] == loop_a.lock_pid
            first = _expires(pg_schema)
            time.sleep(0.05)
            assert loop_a._lead() and _expires(pg_schema) > first      # renewed
            r = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "10"
            assert "database connections are all busy" in r.json()["detail"]
            for conn in held:
                conn.close()
            held.clear()
            r = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
            loop_a.tick()                     # the leader's pass has its connection again
            assert client.get("/healthz").json()["scheduling"] is True
            loop_a.stop()
            loop_b.stop()
    finally:
        for conn in held:
            conn.close()
        a.engine.dispose()
        b.engine.dispose()


def test_bad_pool_settings_fail_in_one_line(tmp_path):
    from tests.scheduler_core.test_input_errors import cli, one_line_error

    db = f"sqlite:///{tmp_path / 'x.db'}"
    one_line_error(cli("server", "--db", db, "--create", "--port", "1",
                       "--db-pool-timeout", "0"),
                   "--db-pool-timeout: 0 is out of bounds; use 0.1 to 600 seconds")
    env_before = dict(os.environ)
    try:
        os.environ[budgets.REPLICAS_ENV] = "0"
        url = PG_ADMIN
        one_line_error(cli("server", "--db", url, "--port", "1"),
                       "AIRFLOW_GPU_REPLICAS: 0 is out of bounds; use 1 to 1000")
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    assert re.search(r"--replicas", cli("server", "--help").stdout)
