"""Databases for the service tests: a SQLite file, and the machine's PostgreSQL
(127.0.0.1:5432, user postgres, database test) in a schema of its own per test."""

from __future__ import annotations

import os
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
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


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'airflow-gpu.db'}"
        return
    schema, url = _pg_schema_url()
    try:
        yield url
    finally:
        _drop_pg_schema(schema)


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


@pytest.fixture
def api(db_url):
    yield from serve(db_url)
