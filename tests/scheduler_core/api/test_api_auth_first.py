"""The token before the body: every route that needs a token answers a request without
one, or with one that is unknown, malformed or expired, 401 (and an agent token on a
route it may not use 403) before it reads a byte of the body, however bad the body (it
answered 422 listing the body's fields). The routes are those of the route table of
docs/service.md; the probes stay open."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from airflow_gpu.scheduler_core.api.authfirst import needs_token
from airflow_gpu.scheduler_core.service.auth import create_token
from tests.databases import serve
from tests.helpers import REPO

OPEN = {("GET", "/healthz"), ("GET", "/livez"), ("GET", "/readyz"), ("GET", "/metrics")}
BAD_BODIES = (b'{"nope": ', b'{"unknown_field": [1, 2, 3], "spec": 7}')


class Spy:
    """The app, noting each request whose body it read."""

    def __init__(self, app):
        self.app, self.read = app, []

    async def __call__(self, scope, receive, send):
        async def spied():
            message = await receive()
            if message["type"] == "http.request":
                self.read.append((scope["method"], scope["path"]))
            return message

        await self.app(scope, spied, send)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    yield from serve(f"sqlite:///{tmp_path_factory.mktemp('authfirst') / 'db.sqlite'}")


def _pairs(app) -> set[tuple[str, str]]:
    """The API's routes (the docs pages apart)."""
    return {(m, r.path) for r in app.routes if isinstance(r, APIRoute) and
            r.include_in_schema for m in r.methods}


def _guarded(app) -> list[tuple[str, str]]:
    return sorted((m, r.path) for r in app.routes if isinstance(r, APIRoute) and
                  needs_token(r) for m in r.methods)


def _documented() -> set[tuple[str, str]]:
    """(method, path) of each route in docs/service.md's route table, `{…}` for a path
    parameter; `/release` after `POST /api/v1/jobs/{id}/hold` is its sibling."""
    text = (REPO / "docs" / "service.md").read_text()
    table = text.split("| route | what |", 1)[1].split("\n\n", 1)[0]
    pairs = set()
    for line in table.splitlines()[2:]:
        first = re.match(r"^\| (.*?) \| ", line).group(1)
        method = path = None
        for item in re.findall(r"`([^`]+)`", first):
            said = re.match(r"^(GET|POST|PUT|PATCH|DELETE) (/\S+)$", item)
            if said:
                method, path = said.group(1), said.group(2)
            else:                                   # a sibling: the last segment changes
                path = path.rsplit("/", 1)[0] + item
            path = re.split(r"[?\[]", path)[0]
            pairs.add((method, re.sub(r"\{[^}]*\}", "{}", path)))
    return pairs


def test_the_routes_are_those_the_docs_list_and_all_but_the_probes_need_a_token(api):
    routes = _pairs(api.app)
    assert {(m, re.sub(r"\{[^}]*\}", "{}", p)) for m, p in routes} == _documented()
    assert set(_guarded(api.app)) == {(m, p) for m, p in routes if p.startswith("/api/")}
    assert routes - set(_guarded(api.app)) == OPEN


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "dgx-1", path)


def _send(client, method, path, headers, body):
    return client.request(method, _concrete(path), content=body, headers={
        "Content-Type": "application/json", **headers})


def test_no_valid_token_is_401_before_the_body_is_read(api):
    expiring = create_token(api.service.sessions, "vision",
                            expires_at=datetime.now(UTC) + timedelta(seconds=1))
    time.sleep(1.1)
    spy = Spy(api.app)
    client = TestClient(spy)        # no lifespan: the app already runs in `api`
    callers = ({}, {"Authorization": "Bearer agpu_not-a-token"},
               {"Authorization": "Basic dmlzaW9uOnNlY3JldA=="},
               {"Authorization": "Bearer"}, {"Authorization": f"Bearer {expiring}"})
    guarded = _guarded(api.app)
    assert len(guarded) >= 30
    for method, path in guarded:
        for headers in callers:
            for body in BAD_BODIES:
                r = _send(client, method, path, headers, body)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.headers["WWW-Authenticate"] == "Bearer"
                assert "token" in r.json()["detail"]
    assert spy.read == []
    # with a valid token the body is read, and a bad one is the 422 it was
    r = _send(client, "POST", "/api/v1/jobs",
              {"Authorization": f"Bearer {api.tokens['vision']}"}, BAD_BODIES[1])
    assert r.status_code == 422 and spy.read == [("POST", "/api/v1/jobs")]


def test_an_agent_token_off_its_routes_is_403_before_the_body_is_read(api):
    agent = {"Authorization": "Bearer " + create_token(api.service.sessions, None,
                                                       hosts=["dgx-2"])}
    spy = Spy(api.app)
    client = TestClient(spy)
    for method, path in _guarded(api.app):
        r = _send(client, method, path, agent, BAD_BODIES[0])
        assert r.status_code == 403, (method, path, r.text)
        assert "agent token" in r.json()["detail"]
    assert spy.read == []
