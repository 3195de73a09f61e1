"""Property-based fuzzing of the API against its own OpenAPI (schemathesis), on a real
server over loopback: whatever the input, no 5xx."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings

from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.servers import Server


@pytest.fixture
def fuzz_server(db_url, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"hosts": [{"name": "dgx-1", "model": "dgx-a100"}]}))
    db = db_url
    engine = make_engine(db)
    upgrade(engine)
    token = create_token(sessions(engine), "fuzz", admin=True)
    server = Server(db, cluster, log=tmp_path / "server.log")
    server.token = token
    yield server
    server.stop()
    engine.dispose()


def test_no_server_errors(fuzz_server):
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {fuzz_server.token}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 11
    for op in operations:
        _fuzz(op, headers, fuzz_server.log)


def _fuzz(op, headers: dict, log) -> None:
    @given(case=op.as_strategy())
    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def no_5xx(case):
        response = case.call(headers=headers, timeout=30)
        assert response.status_code < 500, (op.method, case.formatted_path, response.text,
                                            log.read_text()[-3000:])

    no_5xx()


# Numbers and strings JSON allows but the API does not. Schemathesis draws only finite
# floats and valid text (its strategies hard-code allow_nan=False, allow_infinity=False and a
# UTF-8 codec), so each leaf of bodies it draws is replaced by each of these in turn and
# sent as raw JSON: the answer is a 422 naming that field, never a 5xx.
UNFIT = ("NaN", "Infinity", "-Infinity", "1e400", '"\\ud800"', '"x\\udfff"')
_HOLE = "@@unfit@@"


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _with_hole(value, path):
    if not path:
        return _HOLE
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _with_hole(value[head], rest)}
    return [_with_hole(v, rest) if i == head else v for i, v in enumerate(value)]


def test_unfit_numbers_and_strings_in_any_body_field_are_422_naming_it(fuzz_server):
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {fuzz_server.token}",
               "Content-Type": "application/json"}
    operations = [result.ok() for result in schema.get_all_operations()]
    with_body = [op for op in operations if op.body]
    assert len(with_body) >= 5
    sent: list[str] = []
    with httpx.Client(base_url=fuzz_server.url, headers=headers, timeout=30) as client:
        for op in with_body:
            _unfit_in(op, client, fuzz_server.log, sent)
    assert len(set(sent)) >= 5, sent            # each operation with a body was tried


def _unfit_in(op, client, log, sent: list[str]) -> None:
    @given(case=op.as_strategy())
    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def named_422(case):
        # bodies with leaves (optional fields may all be left out): the first three count
        if not isinstance(case.body, dict | list) or not list(_leaves(case.body)) or \
                sent.count(f"{op.method} {op.path}") >= 3 * len(UNFIT):
            return
        for path in list(_leaves(case.body))[:40]:
            raw = json.dumps(_with_hole(case.body, path))
            for token in UNFIT:
                r = client.request(case.method, case.formatted_path, params=case.query,
                                   content=raw.replace(f'"{_HOLE}"', token))
                assert r.status_code == 422, (op.method, case.formatted_path, path, token,
                                              r.status_code, r.text[:500],
                                              log.read_text()[-3000:])
                assert ["body", *path] in [d["loc"] for d in r.json()["detail"]], r.text
                sent.append(f"{op.method} {op.path}")

    named_422()
