"""Databases for the service tests: a SQLite file, and the machine's PostgreSQL
(127.0.0.1:5432, user postgres): `db_url` gives each test a database of its own at head,
copied from a template; `_pg_schema_url` an empty schema in database test."""

from __future__ import annotations

import os
import shutil
import sqlite3
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.store.db import make_engine, upgrade
from tests.helpers import make_cluster

PG_ADMIN = os.environ.get("AIRFLOW_GPU_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_schema_url() -> tuple[str, str]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with create_engine(PG_ADMIN).begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    return schema, f"{PG_ADMIN}?options=-csearch_path%3D{schema}"


def _drop_pg_schema(schema: str) -> None:
    engine = create_engine(PG_ADMIN)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()


class Templates:
    """Schemas already at head, made once per test process: each test's database is a
    copy (a file copy on SQLite, CREATE DATABASE ... TEMPLATE on PostgreSQL, ~60 ms)
    instead of running every migration again (~0.2 s of CPU and ~0.4 s on PostgreSQL)."""

    def __init__(self, folder):
        self.folder, self.sqlite, self.pg = folder, None, None
        self._drops: ThreadPoolExecutor | None = None

    def sqlite_file(self, path) -> str:
        if self.sqlite is None:
            self.sqlite = self.folder / "template.db"
            engine = make_engine(f"sqlite:///{self.sqlite}")
            upgrade(engine)
            engine.dispose()
            with sqlite3.connect(self.sqlite) as conn:     # everything in the main file
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        shutil.copyfile(self.sqlite, path)
        return f"sqlite:///{path}"

    def pg_database(self) -> tuple[str, str]:
        if self.pg is None:
            self.pg = f"tmpl_{uuid.uuid4().hex[:12]}"
            _pg_admin(f'CREATE DATABASE "{self.pg}"')
            engine = make_engine(_pg_url(self.pg))
            upgrade(engine)
            engine.dispose()
        name = f"t_{uuid.uuid4().hex[:12]}"
        _pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.pg}"')
        return name, _pg_url(name)

    def drop(self, database: str) -> None:
        """Drop a test's database later, in the order asked; `close` waits for them."""
        if self._drops is None:
            self._drops = ThreadPoolExecutor(1, thread_name_prefix="drop-db")
        self._drops.submit(_pg_admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')

    def close(self) -> None:
        if self._drops is not None:
            self._drops.shutdown(wait=True)
        if self.pg is not None:
            _pg_admin(f'DROP DATABASE IF EXISTS "{self.pg}" WITH (FORCE)')


def _pg_url(database: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + f"/{database}"


def _pg_admin(statement: str) -> None:
    engine = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as conn:
        conn.execute(text(statement))
    engine.dispose()


@pytest.fixture(scope="session")
def templates(tmp_path_factory):
    made = Templates(tmp_path_factory.mktemp("templates"))
    yield made
    made.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request, tmp_path):
    """A database with no schema yet (the migrations' own tests)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'airflow-gpu.db'}"
        return
    schema, url = _pg_schema_url()
    try:
        yield url
    finally:
        _drop_pg_schema(schema)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path, templates):
    """A database at head (the store's schema as `db upgrade` leaves it), of its own."""
    if request.param == "sqlite":
        yield templates.sqlite_file(tmp_path / "airflow-gpu.db")
        return
    name, url = templates.pg_database()
    try:
        yield url
    finally:       # dropped by a thread of its own: the next test need not wait for it
        templates.drop(name)


# two dgx-a100 hosts under one switch
HOSTS = ({"name": "dgx-[1-2]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


def serve(db_url: str, policy=None, hosts=HOSTS):
    """The real app on its real store (with `policy`, on the cluster of `hosts`), with
    tokens for teams vision and nlp and an admin; `client.tick()` runs one scheduling
    pass, `client.deliver()` sends the webhook notifications due."""
    service = Service(Settings(db_url, make_cluster(*hosts), policy or PolicyConfig(),
                               lease_ttl=30))
    app = create_app(service, run_loop=False)
    tokens = {t: create_token(service.sessions, t) for t in ("vision", "nlp")}
    tokens["admin"] = create_token(service.sessions, "ops", admin=True)
    with TestClient(app) as client:
        client.tokens = tokens
        client.tick = app.state.loop.tick
        client.deliver = app.state.loop.deliver
        client.service = service
        yield client
    service.engine.dispose()


def team_client(db_url: str, run_loop: bool = False, team: str = "vision", **settings):
    """The real app on its real store (the HOSTS cluster), its client sending team
    `team`'s token; with `run_loop`, the scheduling loop runs (else no pass runs)."""
    service = Service(Settings(db_url, make_cluster(*HOSTS), **settings))
    app = create_app(service, run_loop=run_loop)
    token = create_token(service.sessions, team)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        client.service = service
        yield client
    service.engine.dispose()


@pytest.fixture
def api(db_url):
    yield from serve(db_url)
