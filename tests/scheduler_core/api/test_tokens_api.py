"""Tokens through the API (GET/POST/DELETE /api/v1/tokens) and `airflow-gpu token list |
create | revoke` against it, on SQLite and PostgreSQL: only admins manage tokens; lists
never hold a secret; a revoked or expired token is refused (401); `--db URL` keeps working
for the first admin token."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from airflow_gpu.scheduler_core.engine.topology import load_topology
from airflow_gpu.scheduler_core.service import auth
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.cli.test_cli_e2e import cli, server  # noqa: F401  (the server fixture)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def admin(api) -> dict:
    return bearer(api.tokens["admin"])


def works(api, token: str) -> int:
    return api.get("/api/v1/jobs", headers=bearer(token)).status_code


def test_admins_list_tokens_without_their_secrets(api):
    r = api.get("/api/v1/tokens", headers=admin(api))
    assert r.status_code == 200, r.text
    tokens = r.json()
    assert [(t["team"], t["role"]) for t in tokens] == [("vision", "team"), ("nlp", "team"),
                                                         ("ops", "admin")]
    for t, secret in zip(tokens, (api.tokens["vision"], api.tokens["nlp"],
                                  api.tokens["admin"]), strict=True):
        assert set(t) == {"id", "team", "role", "user", "hosts", "allow_new_hosts", "created_at",
                          "expires_at", "expired", "hint"}
        assert t["hint"] == f"agpu_...{secret[-4:]}" and secret not in r.text
        assert t["expires_at"] is None and t["expired"] is False and t["created_at"]
    assert [t["team"] for t in api.get("/api/v1/tokens?team=nlp",
                                       headers=admin(api)).json()] == ["nlp"]


def test_only_admins_manage_tokens(api):
    agent = auth.create_token(api.service.sessions, None, hosts=["dgx-1"])
    for who in (api.tokens["vision"], agent):
        assert api.get("/api/v1/tokens", headers=bearer(who)).status_code == 403
        assert api.post("/api/v1/tokens", json={"team": "vision"},
                        headers=bearer(who)).status_code == 403
        assert api.delete("/api/v1/tokens/1", headers=bearer(who)).status_code == 403
        assert api.delete("/api/v1/tokens?team=nlp", headers=bearer(who)).status_code == 403
    r = api.get("/api/v1/tokens", headers=bearer(api.tokens["vision"]))
    assert "only admins" in r.json()["detail"]
    assert api.get("/api/v1/tokens").status_code == 401
    assert works(api, api.tokens["nlp"]) == 200       # nothing was revoked


def test_create_use_and_revoke_through_the_api(api):
    r = api.post("/api/v1/tokens", json={"team": "audio", "expires_in": "30d"},
                 headers=admin(api))
    assert r.status_code == 201, r.text
    made = r.json()
    secret = made["token"]
    assert secret.startswith("agpu_") and made["role"] == "team" and made["team"] == "audio"
    expires = datetime.fromisoformat(made["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=1)
    assert works(api, secret) == 200
    job = api.post("/api/v1/jobs", json={"spec": {"name": "j", "roles": [
        {"name": "w", "gpus": 1}]}}, headers=bearer(secret)).json()
    assert job["team"] == "audio"
    listed = {t["id"]: t for t in api.get("/api/v1/tokens", headers=admin(api)).json()}
    assert listed[made["id"]]["hint"] == f"agpu_...{secret[-4:]}"
    assert "token" not in listed[made["id"]]

    r = api.delete(f"/api/v1/tokens/{made['id']}", headers=admin(api))
    assert r.status_code == 200 and r.json()["id"] == made["id"]
    assert works(api, secret) == 401        # this process refuses it at once
    assert api.delete(f"/api/v1/tokens/{made['id']}", headers=admin(api)).status_code == 404
    assert made["id"] not in {t["id"] for t in api.get("/api/v1/tokens",
                                                       headers=admin(api)).json()}

    # an admin token and an agent token
    boss = api.post("/api/v1/tokens", json={"team": "ops", "role": "admin"},
                    headers=admin(api)).json()
    assert boss["role"] == "admin" and boss["expires_at"] is None
    assert api.get("/api/v1/tokens", headers=bearer(boss["token"])).status_code == 200
    agent = api.post("/api/v1/tokens", json={"role": "agent", "hosts": ["dgx-1"]},
                     headers=admin(api)).json()
    assert (agent["team"], agent["hosts"]) == ("agents", ["dgx-1"])
    body = {"topology": load_topology("dgx-a100").document()}
    assert api.put("/api/v1/hosts/dgx-1", json=body,
                   headers=bearer(agent["token"])).status_code == 200
    assert works(api, agent["token"]) == 403

    # every token of a team at once
    r = api.delete("/api/v1/tokens?team=nlp", headers=admin(api))
    assert r.status_code == 200 and [t["team"] for t in r.json()] == ["nlp"]
    assert works(api, api.tokens["nlp"]) == 401


@pytest.mark.parametrize("body, says", [
    ({"team": "bad team"}, "team"),
    ({"team": "x" * 201}, "team"),
    ({"role": "team"}, "needs a team"),
    ({"team": "ops", "role": "root"}, "role"),
    ({"role": "agent"}, "hosts"),
    ({"team": "vision", "hosts": ["dgx-1"]}, "hosts"),
    ({"role": "agent", "hosts": ["dgx 1"]}, "hosts"),
    ({"team": "vision", "expires_in": "soon"}, "expires_in"),
    ({"team": "vision", "expires_in": 0}, "expires_in"),
    ({"team": "vision", "expires_at": "2001-01-01T00:00:00Z"}, "not in the future"),
    ({"team": "vision", "expires_in": "1d", "expires_at": "2099-01-01T00:00:00Z"},
     "not both"),
    ({"team": "vision", "secret": "mine"}, "secret"),
])
def test_bad_token_requests_are_422(api, body, says):
    r = api.post("/api/v1/tokens", json=body, headers=admin(api))
    assert r.status_code == 422, r.text
    assert says in r.text
    assert len(api.get("/api/v1/tokens", headers=admin(api)).json()) == 3


def test_an_expired_token_is_refused(api):
    made = api.post("/api/v1/tokens", json={"team": "vision", "expires_in": 1},
                    headers=admin(api)).json()
    assert works(api, made["token"]) == 200          # looked up and remembered
    at = datetime.fromisoformat(made["expires_at"])
    while datetime.now(UTC) < at:
        time.sleep(0.05)
    r = api.get("/api/v1/jobs", headers=bearer(made["token"]))
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    detail = r.json()["detail"]
    assert detail.startswith(f"token expired at {at.isoformat(timespec='seconds')}")
    assert "ask an admin for a new one" in detail
    listed = {t["id"]: t for t in api.get("/api/v1/tokens", headers=admin(api)).json()}
    assert listed[made["id"]]["expired"] is True


def test_tokens_made_before_0009_keep_working(db_url):
    """A database at 0008 with a token: upgraded, the token works and lists without a
    hint and without expiry."""
    engine = make_engine(db_url)
    upgrade(engine, "0008")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tokens (token_hash, team, admin, created_at, role) "
                          "VALUES (:h, 'vision', :no, :at, 'team')"),
                     {"h": auth._hash("agpu_old"), "no": False, "at": datetime.now(UTC)})
    upgrade(engine)
    (row,) = auth.list_tokens(sessions(engine))
    view = auth.token_view(row)
    assert (view["hint"], view["expires_at"], view["expired"]) == (None, None, False)
    assert auth.principal_for(sessions(engine), "agpu_old").team == "vision"
    engine.dispose()


# -- the CLI --------------------------------------------------------------------------------
def test_the_token_cli_through_the_api(server):  # noqa: F811
    db = server["db"]
    out = cli("token", "create", "--team", "ops", "--admin", "--db", db)   # the first admin
    assert out.returncode == 0, out.stderr
    root = out.stdout.strip()
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": root}

    out = cli("token", "create", "--team", "vision", "--expires", "30d", env=env)
    assert out.returncode == 0, out.stderr
    vision = out.stdout.strip()
    assert vision.startswith("agpu_")
    team_env = {**env, "AIRFLOW_GPU_TOKEN": vision}
    assert cli("queue", env=team_env).returncode == 0

    listed = json.loads(cli("token", "list", "--json", env=env).stdout)
    assert [(t["team"], t["role"]) for t in listed] == [("ops", "admin"), ("vision", "team")]
    assert listed[1]["expires_at"] and listed[1]["hint"].endswith(vision[-4:])
    table = cli("token", "list", env=env)
    assert table.returncode == 0 and "vision" in table.stdout and vision not in table.stdout
    assert vision not in json.dumps(listed)
    # the same list from the database directly
    assert json.loads(cli("token", "list", "--json", "--db", db).stdout)[1]["id"] == \
        listed[1]["id"]

    # a team token may not manage tokens: 403, exit 1
    out = cli("token", "list", env=team_env)
    assert out.returncode == 1 and "403" in out.stderr and "only admins" in out.stderr
    # bad input here: exit 2
    out = cli("token", "create", "--team", "bad team", env=env)
    assert out.returncode == 2 and "--team" in out.stderr
    out = cli("token", "create", "--team", "vision", "--expires", "someday", env=env)
    assert out.returncode == 2 and "--expires" in out.stderr
    out = cli("token", "revoke", vision, env=env)
    assert out.returncode == 2 and "token id" in out.stderr and vision not in out.stderr

    out = cli("token", "revoke", str(listed[1]["id"]), env=env)
    assert out.returncode == 0, out.stderr
    assert "revoked 1 token" in out.stdout and "within 1 s" in out.stdout
    time.sleep(auth.CACHE_SECONDS + 0.2)     # the server process's cache
    out = cli("queue", env=team_env)
    assert out.returncode == 1 and "401" in out.stderr

    # an expired token
    out = cli("token", "create", "--team", "vision", "--expires", "1s", env=env)
    short = out.stdout.strip()
    time.sleep(1.2)
    out = cli("queue", env={**env, "AIRFLOW_GPU_TOKEN": short})
    assert out.returncode == 1 and "token expired at" in out.stderr

    # --db keeps working: create with an expiry, revoke by id and by team
    out = cli("token", "create", "--team", "nlp", "--expires", "2099-01-01", "--db", db)
    assert out.returncode == 0, out.stderr
    nlp = json.loads(cli("token", "list", "--team", "nlp", "--json", env=env).stdout)
    assert nlp[0]["expires_at"].startswith("2099-01-01")
    out = cli("token", "revoke", str(nlp[0]["id"]), "--db", db)
    assert out.returncode == 0 and "revoked 1 token" in out.stdout
    out = cli("token", "revoke", "--team", "vision", env=env)
    assert out.returncode == 0 and "revoked 1 token" in out.stdout   # the expired one
    assert [t["team"] for t in json.loads(cli("token", "list", "--json",
                                              env=env).stdout)] == ["ops"]
