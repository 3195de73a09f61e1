"""The store under trouble: SQLite recovers by itself once its files are writable again,
/livez and /readyz tell liveness from readiness (a write that commits, and passes), and
each process keeps to a connection budget, so three replicas fit a PostgreSQL server's
max_connections and leave room for others. Real `airflow-gpu server` processes, on a
SQLite file and on a private PostgreSQL server started for these tests."""

from __future__ import annotations

import collections
import contextlib
import glob
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio
import httpx
import psycopg
import pytest
import yaml
from fastapi.testclient import TestClient

from airflow_gpu.demo.stack import free_port
from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.service import health
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.store import db
from airflow_gpu.scheduler_core.store.budget import LOOP_THREADS
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.databases import HOSTS, PG_ADMIN
from tests.helpers import make_cluster, until
from tests.servers import Server, no_failed_requests


def spec(name: str) -> dict:
    return {"name": name, "expected_runtime": "1h", "roles": [{"name": "w", "gpus": 0,
                                                               "cpus": 1}]}



class Load:
    """`clients` threads submitting jobs and listing them against `url`, each request's
    outcome recorded with its time; `clients` may be changed while it runs."""

    def __init__(self, urls: list[str], token: str, clients: int):
        self.urls, self.token, self.clients = urls, token, clients
        self.results: collections.deque = collections.deque()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True)
                        for i in range(clients)]
        for t in self.threads:
            t.start()

    def _work(self, i: int) -> None:
        url = self.urls[i % len(self.urls)]
        with httpx.Client(base_url=url, timeout=60,
                          headers={"Authorization": f"Bearer {self.token}"}) as c:
            n = 0
            while not self.stop.is_set():
                if i >= self.clients:
                    time.sleep(0.05)
                    continue
                n += 1
                try:
                    r = (c.post("/api/v1/jobs", json={"spec": spec(f"j{i}-{n}")}) if n % 2
                         else c.get("/api/v1/jobs", params={"limit": 5}))
                    self.results.append((time.monotonic(), r.status_code, r.text[:200]))
                except httpx.HTTPError as exc:
                    self.results.append((time.monotonic(), type(exc).__name__, str(exc)))
                time.sleep(0.01)

    def between(self, start: float, end: float) -> list[tuple]:
        return [r for r in list(self.results) if start <= r[0] < end]

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)


# -- point 3: SQLite recovers after a read-only (or full) disk --------------------------------

def _immutable(paths: list[Path], on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], check=True,
                   capture_output=True)


@pytest.fixture
def sqlite_server(tmp_path):
    """A real server on a SQLite file in a folder of its own, with a token."""
    folder = tmp_path / "db"
    folder.mkdir()
    url = f"sqlite:///{folder / 'gpu.db'}"
    engine = make_engine(url)
    upgrade(engine)
    token = create_token(sessions(engine), "vision")
    engine.dispose()
    probe = tmp_path / "probe"
    probe.write_text("x")
    try:                             # root ignores chmod: the immutable flag stops it
        _immutable([probe], True)
        _immutable([probe], False)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("chattr +i does not work here (it makes files read-only even for root)")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": list(HOSTS)}))
    server = Server(url, cluster, log=tmp_path / "server.log")
    try:
        yield server, token, folder
    finally:
        # never leave immutable files behind
        _immutable([folder, *folder.iterdir()], False)
        server.stop()


def test_sqlite_recovers_within_seconds_after_its_files_were_read_only(sqlite_server):
    """The database file, its WAL and its folder read-only for 4s (root ignores chmod, so
    the immutable flag; the -shm file is left alone: SQLite maps it, and a mapping that can
    no longer write kills the process). Requests that must write get 503 meanwhile,
    connections opened then are read-only, /readyz is 503 and /livez 200; once writable
    again, every request succeeds within a few seconds, and /readyz is 200."""
    server, token, folder = sqlite_server
    # many clients while the files are read-only, so the pool opens (read-only) connections
    load = Load([server.url], token, clients=16)
    try:
        time.sleep(2)
        files = [folder, *(p for p in folder.iterdir() if not p.name.endswith("-shm"))]
        _immutable(files, True)
        t_ro = time.monotonic()
        time.sleep(1)
        live = httpx.get(f"{server.url}/livez")
        ready_ro = httpx.get(f"{server.url}/readyz", timeout=10)
        time.sleep(3)
        load.clients = 4         # fewer clients than the pool holds: nothing churns it
        _immutable(files, False)
        t_rw = time.monotonic()
        time.sleep(7)
        ready_rw = httpx.get(f"{server.url}/readyz", timeout=10)
    finally:
        load.close()
    during = load.between(t_ro, t_rw)
    assert any(r[1] == 503 for r in during), collections.Counter(r[1] for r in during)
    # a few seconds to recover, then every request succeeds
    after = load.between(t_rw + 3, t_rw + 7)
    failed = [r for r in after if r[1] not in (200, 201)]
    assert len(after) > 100 and not failed, (
        f"{len(failed)} of {len(after)} requests failed 3-7s after the files were writable "
        f"again: {collections.Counter(r[1] for r in failed)}, e.g. {failed[:2]}")
    assert live.status_code == 200
    assert ready_ro.status_code == 503, ready_ro.text
    assert int(ready_ro.headers["Retry-After"]) == health.RETRY_AFTER
    assert ready_ro.json()["database"]["ok"] is False
    assert ready_rw.status_code == 200, ready_rw.text


# -- a private PostgreSQL server (points 5 and 6) -------------------------------------------

class Postgres:
    """A PostgreSQL server of its own (initdb in a temporary folder, run as the postgres
    OS user) on a free loopback port, with a role `gpu` that is not a superuser (so the
    superuser-reserved slots do not count) owning database `gpu`."""

    def __init__(self, max_connections: int = 30):
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found or os.geteuid() != 0 or shutil.which("runuser") is None:
            pytest.skip("needs PostgreSQL's binaries and root (to run them as postgres)")
        self.bin = Path(found[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="airflow-gpu-pg-"))
        self.data, self.port = self.dir / "data", free_port()
        shutil.chown(self.dir, "postgres")
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                 "--no-sync")
        self.max_connections = max_connections
        self.start()
        with self.admin() as conn:
            conn.execute("CREATE ROLE gpu LOGIN")
            conn.execute("CREATE DATABASE gpu OWNER gpu")
        self.url = f"postgresql+psycopg://gpu@127.0.0.1:{self.port}/gpu"

    def _pg(self, tool: str, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bin / tool), *args],
                       check=True, capture_output=True, cwd=self.dir)

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.dir / "log"), "-o",
                 f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
                 f"-c max_connections={self.max_connections} "
                 "-c superuser_reserved_connections=3 -c fsync=off", "start")

    def stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")

    def admin(self):
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname="postgres", autocommit=True)

    def watch(self, seconds: float) -> tuple[int, list]:
        """For `seconds`, every 0.3 s: the most connections role gpu held, and whether
        another client of that role (not a superuser: no reserved slot for it) could
        connect then (1, else the first line of its error)."""
        peak, other = 0, []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            peak = max(peak, self.gpu_connections())
            try:
                with psycopg.connect(host="127.0.0.1", port=self.port, user="gpu",
                                     dbname="gpu", connect_timeout=5) as conn:
                    other.append(conn.execute("SELECT 1").fetchone()[0])
            except Exception as exc:      # noqa: BLE001 - recorded, asserted by the caller
                other.append(str(exc).strip().splitlines()[0])
            time.sleep(0.3)
        return peak, other

    def gpu_connections(self) -> int:
        with self.admin() as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = "
                                "'gpu'").fetchone()[0]

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def postgres():
    pg = Postgres()
    try:
        yield pg
    finally:
        pg.close()


# -- point 5: /healthz, /livez and /readyz ----------------------------------------------------

def test_readyz_fails_while_postgresql_is_down_and_passes_after(postgres, caplog):
    """The database stops: /livez stays 200, /healthz answers as before, /readyz is 503
    with Retry-After, and API requests are 503 with Retry-After and one log line (no
    traceback). It starts again: /readyz is 200 and requests succeed within seconds."""
    service = Service(Settings(postgres.url, make_cluster(*HOSTS), pass_interval=0.1))
    token = create_token(service.sessions, "vision")
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(service), raise_server_exceptions=False) as api:
        body = until(lambda: (r := api.get("/readyz")).status_code == 200
                     and r.json()["scheduling"].get("this_replica") and r.json(),
                     "ready and leading at start")
        assert body["database"]["ok"] and body["status"] == "ready"
        assert api.post("/api/v1/jobs", json={"spec": spec("before")},
                        headers=auth).status_code == 201
        postgres.stop()
        try:
            with caplog.at_level(logging.WARNING, logger="airflow_gpu"):
                caplog.clear()
                r = api.get("/readyz")
                assert r.status_code == 503, r.text
                assert int(r.headers["Retry-After"]) == health.RETRY_AFTER
                assert r.json()["status"] == "not ready"
                assert "the database cannot write" in r.json()["problems"][0]
                assert api.get("/livez").json() == {"status": "ok"}
                h = api.get("/healthz")
                assert h.status_code == 200 and h.json()["status"] == "ok"
                for _ in range(2):                 # a dead pooled connection, a refused one
                    r = api.post("/api/v1/jobs", json={"spec": spec("down")}, headers=auth)
                    assert r.status_code == 503, r.text
                    assert int(r.headers["Retry-After"]) == health.RETRY_AFTER
                    assert "the database cannot be reached" in r.json()["detail"]
                told = [rec for rec in caplog.records if "503: the database cannot be "
                        "reached" in rec.getMessage()]
                assert len(told) == 2 and not any(rec.exc_info for rec in told)
        finally:
            postgres.start()
        until(lambda: api.get("/readyz").status_code == 200, "ready again", timeout=10)
        r = api.post("/api/v1/jobs", json={"spec": spec("after")}, headers=auth)
        assert r.status_code == 201, r.text
    service.engine.dispose()


def test_readyz_of_a_follower_reads_the_leaders_lease(postgres):
    """A replica that does not lead is ready while the leader's lease is live, and says
    no replica schedules once it has expired."""
    settings = Settings(postgres.url, make_cluster(*HOSTS), pass_interval=0.1)
    leader, follower = Service(settings), Service(settings)
    la, fa = create_app(leader), create_app(follower, run_loop=False)
    with TestClient(la) as lead:
        # ready and leading: a replica is ready before its first election, and under load
        # the follower's election below could otherwise come first and win
        until(lambda: (r := lead.get("/readyz")).status_code == 200
              and r.json()["scheduling"]["this_replica"], "the leader is ready and leads")
        loop = fa.state.loop
        loop.started_at = time.time()
        until(lambda: not loop._lead() and loop.deployment, "the follower sees a leader")
        with TestClient(fa) as follow:
            r = follow.get("/readyz")
            assert r.status_code == 200, r.text
            assert r.json()["scheduling"]["this_replica"] is False
    # the leader stopped (and gave its lease up): nobody schedules
    with TestClient(fa) as follow:
        r = until(lambda: (r := follow.get("/readyz")).status_code == 503 and r,
                  "the follower is not ready", timeout=10)
        assert "no replica is scheduling" in " ".join(r.json()["problems"]), r.text
    leader.engine.dispose()
    follower.engine.dispose()


# -- point 6: a connection budget -------------------------------------------------------------

def test_pool_size_is_a_setting_and_its_default_fits_the_api_threads(monkeypatch):
    engine = make_engine(PG_ADMIN)
    assert engine.pool.size() == db.POOL_SIZE == db.API_THREADS + 1
    assert engine.pool._max_overflow == 0
    monkeypatch.setenv(db.POOL_SIZE_ENV, "7")
    assert make_engine(PG_ADMIN).pool.size() == 7
    assert make_engine(PG_ADMIN, pool_size=9).pool.size() == 9
    monkeypatch.setenv(db.POOL_SIZE_ENV, "1")
    with pytest.raises(Exception, match="out of bounds"):
        make_engine(PG_ADMIN)

    async def threads() -> float:      # what FastAPI runs sync routes in
        return anyio.to_thread.current_default_thread_limiter().total_tokens

    assert anyio.run(threads) == db.API_THREADS
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "server", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--db-pool-size" in out


def test_three_replicas_fit_max_connections_and_leave_room(postgres, tmp_path):
    """max_connections 30 (27 for roles that are not superusers): three replicas with
    pools of 6 use at most 3 x (6 + the lock connection) = 21 under load that keeps their
    API threads busy, every request succeeds, and a fourth client still connects."""
    engine = make_engine(postgres.url)      # one connection: pools open lazily
    upgrade(engine)
    token = create_token(sessions(engine), "vision")
    engine.dispose()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": list(HOSTS)}))
    pool, env = 6, dict(os.environ)
    os.environ["AIRFLOW_GPU_DB_POOL_SIZE"] = str(pool)   # as --db-pool-size sets it
    servers: list[Server] = []
    try:
        for i in range(3):
            servers.append(Server(postgres.url, cluster, log=tmp_path / f"s{i}.log"))
    finally:
        os.environ.clear()
        os.environ.update(env)
    load = Load([s.url for s in servers], token, clients=40)
    try:
        peak, fourth = postgres.watch(7)
    finally:
        load.close()
        for s in servers:
            s.stop()
    results = list(load.results)
    no_failed_requests(results, 300)
    assert all(f == 1 for f in fourth), [f for f in fourth if f != 1][:3]
    # the requests filled what their pools give them (40 clients on 3 x (6 - the loop's
    # LOOP_THREADS) connections) and everything stayed within the budget
    assert 3 * (pool - LOOP_THREADS) <= peak <= 3 * (pool + 1) + 1, peak
