"""Property-based fuzzing of the API against its own OpenAPI (schemathesis), on a real
server over loopback: whatever the input, no 5xx."""

from __future__ import annotations

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings

from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.service.servers import Server


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
    @settings(max_examples=30, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def no_5xx(case):
        response = case.call(headers=headers, timeout=30)
        assert response.status_code < 500, (op.method, case.formatted_path, response.text,
                                            log.read_text()[-3000:])

    no_5xx()
