"""/metrics and /healthz behind a token (`--protect-metrics none|token|admin`): they name
teams, jobs and the database backends that hold the scheduler lock. /livez and /readyz
stay open for orchestrators' probes, and /readyz then tells callers without a token only
whether the replica is ready. The real app on SQLite and PostgreSQL, and a real server."""

from __future__ import annotations

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import text

from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.databases import HOSTS
from tests.helpers import make_cluster
from tests.scheduler_core.test_input_errors import cli, one_line_error
from tests.servers import Server

SPEC = {"name": "secret-job", "expected_runtime": "1h", "roles": [{"name": "w", "gpus": 1}]}


def protected(db_url: str, mode: str):
    service = Service(Settings(db_url, make_cluster(*HOSTS), PolicyConfig(), lease_ttl=30))
    app = create_app(service, run_loop=False, protect=mode)
    tokens = {"vision": create_token(service.sessions, "vision"),
              "admin": create_token(service.sessions, "ops", admin=True),
              "agent": create_token(service.sessions, None, hosts=["dgx-1"])}
    client = TestClient(app)
    client.tokens = tokens
    client.service = service
    return client


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def make(db_url):
    made = []

    def _make(mode: str):
        client = protected(db_url, mode).__enter__()
        made.append(client)
        r = client.post("/api/v1/jobs", json={"spec": SPEC},
                        headers=bearer(client.tokens["vision"]))
        assert r.status_code == 201, r.text
        client.app.state.loop.tick()
        return client
    yield _make
    for client in made:
        client.__exit__(None, None, None)
        client.service.engine.dispose()


def test_by_default_anyone_reads_them_and_they_name_teams(make):
    api = make("none")
    metrics = api.get("/metrics")
    assert metrics.status_code == 200 and 'team="vision"' in metrics.text
    assert api.get("/healthz").status_code == 200
    assert api.get("/readyz").json()["status"] == "ready"


def test_token_mode_needs_any_valid_token(make):
    api = make("token")
    for path in ("/metrics", "/healthz"):
        r = api.get(path)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
        assert r.json()["detail"] == (
            f"GET {path} needs a bearer token (the server runs with --protect-metrics "
            "token): no valid bearer token was sent; send 'Authorization: Bearer <token>' "
            "(airflow-gpu token create --team T)")
        assert "vision" not in r.text
        r = api.get(path, headers=bearer("agpu_not-a-token"))
        assert r.status_code == 401 and "the token is unknown (or revoked)" in r.text
        for who in ("vision", "admin", "agent"):
            r = api.get(path, headers=bearer(api.tokens[who]))
            assert r.status_code == 200, (who, r.text)
    assert 'team="vision"' in api.get("/metrics", headers=bearer(api.tokens["vision"])).text
    # the probes stay open, and carry no names
    assert api.get("/livez").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready"}
    full = api.get("/readyz", headers=bearer(api.tokens["vision"])).json()
    assert full["status"] == "ready" and "database" in full


def test_admin_mode_needs_an_admin_token(make):
    api = make("admin")
    r = api.get("/metrics", headers=bearer(api.tokens["vision"]))
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == (
        "GET /metrics needs an admin token (the server runs with --protect-metrics admin); "
        "this is a team token of team 'vision': use an admin token (airflow-gpu token "
        "create --team T --admin)")
    r = api.get("/healthz", headers=bearer(api.tokens["agent"]))
    assert r.status_code == 403 and "an agent token for hosts dgx-1" in r.text, r.text
    assert api.get("/healthz").status_code == 401
    assert api.get("/metrics", headers=bearer(api.tokens["admin"])).status_code == 200
    assert api.get("/healthz", headers=bearer(api.tokens["admin"])).json()["status"] == "ok"


def test_a_replica_that_is_not_ready_tells_its_problems_only_to_who_may_read_them(make):
    """The database cannot write (its schema's revision table renamed away): 503 with
    Retry-After for everyone; the problems (the database's own words) only with a token."""
    api = make("admin")
    engine = api.service.engine
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE alembic_version RENAME TO alembic_version_away"))
    try:
        r = api.get("/readyz")
        assert r.status_code == 503 and r.headers["Retry-After"] == "10", r.text
        assert r.json() == {"status": "not ready", "problems": 1, "detail": (
            "the problems are shown with a token (--protect-metrics); see /healthz and "
            "the server's log")}
        r = api.get("/readyz", headers=bearer(api.tokens["vision"]))    # not an admin's
        assert "alembic_version" not in r.text and r.status_code == 503
        r = api.get("/readyz", headers=bearer(api.tokens["admin"]))
        assert r.status_code == 503 and "alembic_version" in " ".join(r.json()["problems"])
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE alembic_version_away RENAME TO alembic_version"))
    assert api.get("/readyz").json() == {"status": "ready"}


def test_the_server_takes_the_setting_from_its_flag_or_the_environment(tmp_path,
                                                                        monkeypatch):
    url = f"sqlite:///{tmp_path / 'gpu.db'}"
    engine = make_engine(url)
    upgrade(engine)
    admin = create_token(sessions(engine), "ops", admin=True)
    team = create_token(sessions(engine), "vision")
    engine.dispose()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": list(HOSTS)}))
    server = Server(url, cluster, log=tmp_path / "s.log", args=("--protect-metrics", "admin"))
    try:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        assert httpx.get(f"{server.url}/healthz", headers=bearer(team)).status_code == 403
        assert httpx.get(f"{server.url}/metrics", headers=bearer(admin)).status_code == 200
        assert httpx.get(f"{server.url}/livez").status_code == 200
        assert httpx.get(f"{server.url}/readyz").json() == {"status": "ready"}
    finally:
        server.stop()
    monkeypatch.setenv("AIRFLOW_GPU_PROTECT_METRICS", "token")
    server = Server(url, cluster, log=tmp_path / "s2.log")
    try:
        assert httpx.get(f"{server.url}/healthz").status_code == 401
        assert httpx.get(f"{server.url}/healthz", headers=bearer(team)).status_code == 200
    finally:
        server.stop()
    one_line_error(cli("server", "--db", url, "--cluster", str(cluster),
                       "--protect-metrics", "tokens"),
                   "error: --protect-metrics: 'tokens' is not a protection of /metrics and "
                   "/healthz; use none (anyone may read them), token (any valid token) or "
                   "admin (an admin token)")
    monkeypatch.setenv("AIRFLOW_GPU_PROTECT_METRICS", "yes")
    one_line_error(cli("server", "--db", url, "--cluster", str(cluster)),
                   "error: AIRFLOW_GPU_PROTECT_METRICS: 'yes' is not a protection")
    with pytest.raises(InputError, match="protect: 'open' is not a protection"):
        protected(url, "open")
