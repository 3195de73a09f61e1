"""Without an Airflow login the plugin answers 401 (no or expired token) or 403 (a token
Airflow did not sign): pages, JSON endpoints and static files alike. With one, it reads
the scheduler with the connection's token, never the user's."""

from __future__ import annotations

import time

import httpx
import jwt
import pytest

from tests.plugin.stack import USERS

PATHS = ["/gpu/", "/gpu/cluster", "/gpu/queue", "/gpu/teams", "/gpu/jobs/{job}",
         "/gpu/api/cluster", "/gpu/api/queue", "/gpu/api/teams", "/gpu/api/jobs/{job}",
         "/gpu/static/gpu.css", "/gpu/static/gpu.js"]


@pytest.fixture(scope="module")
def paths(stack):
    job = stack.scheduler.ids["vision_pipeline.train"]
    return [p.format(job=job) for p in PATHS]


def forged(stack, **claims) -> str:
    """A token like Airflow's, with chosen claims, signed with the server's own secret."""
    now = int(time.time())
    body = {"sub": "viewer", "role": "viewer", "teams": [], "jti": "x" * 32,
            "aud": "apache-airflow", "nbf": now - 60, "iat": now - 60, "exp": now + 600,
            **claims}
    return jwt.encode(body, stack.airflow.env["AIRFLOW__API_AUTH__JWT_SECRET"],
                      algorithm="HS512", headers={"kid": "not-used"})


def test_no_login_is_401_everywhere(stack, paths):
    for path in paths:
        r = httpx.get(stack.url + path, timeout=30)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])


def test_a_token_airflow_did_not_sign_is_403(stack, paths):
    bad = jwt.encode({"sub": "admin", "role": "admin", "aud": "apache-airflow",
                      "exp": int(time.time()) + 600}, "not-the-secret-" + "x" * 64,
                     algorithm="HS512")
    for path in paths:
        for kw in ({"headers": {"Authorization": f"Bearer {bad}"}},
                   {"cookies": {"_token": bad}}, {"cookies": {"_token": "garbage"}}):
            r = httpx.get(stack.url + path, timeout=30, **kw)
            assert r.status_code == 403, (path, kw, r.status_code, r.text[:200])


def test_an_expired_login_is_401(stack, paths):
    old = forged(stack, exp=int(time.time()) - 120)     # past Airflow's leeway (10 s)
    assert forged(stack) != old
    for path in paths:
        r = httpx.get(stack.url + path, cookies={"_token": old}, timeout=30)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])


def test_a_person_without_a_login_gets_a_login_link(stack):
    r = httpx.get(f"{stack.url}/gpu/queue", headers={"Accept": "text/html"}, timeout=30)
    assert r.status_code == 401
    assert 'id="login-link" href="/auth/login?next=%2Fgpu%2Fqueue"' in r.text
    r = httpx.get(f"{stack.url}/gpu/api/queue", headers={"Accept": "text/html"}, timeout=30)
    assert r.status_code == 401 and r.json()["detail"] == "Not authenticated"


@pytest.mark.parametrize("user", sorted(USERS))
def test_a_login_by_cookie_or_bearer_opens_everything(stack, paths, user):
    token = stack.airflow.token(user)
    for path in paths:
        for kw in ({"headers": {"Authorization": f"Bearer {token}"}},
                   {"cookies": {"_token": token}}):
            r = httpx.get(stack.url + path, timeout=30, **kw)
            assert r.status_code == 200, (path, r.status_code, r.text[:200])
    body = httpx.get(f"{stack.url}/gpu/api/cluster", timeout=30,
                     headers={"Authorization": f"Bearer {token}"}).json()
    assert body["summary"]["gpus_total"] == 48


def test_the_airflow_login_is_not_a_scheduler_token(stack):
    """The user's Airflow JWT is never passed on: the scheduler refuses it."""
    token = stack.airflow.token("admin")
    r = httpx.get(f"{stack.scheduler.url}/api/v1/cluster", timeout=30,
                  headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401
