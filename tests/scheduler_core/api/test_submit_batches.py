"""Submits that arrive together are stored together (api/submits.py, jobs.submit_many), on
SQLite and PostgreSQL: one INSERT for a burst, and each caller answered as a submit of its
own would be, whatever else the batch held: a key seen before or twice in the batch, a
spec that can never run, another team's job, a value the database refuses."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import event, func, select

from airflow_gpu.scheduler_core.api import submits
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.scheduler import Rejected
from airflow_gpu.scheduler_core.service import jobs
from airflow_gpu.scheduler_core.service.common import Principal
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.service.errors import Conflict, Forbidden
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import HOSTS
from tests.helpers import make_cluster

VISION = Principal("vision")


@pytest.fixture
def service(db_url):
    svc = Service(Settings(db_url, make_cluster(*HOSTS), PolicyConfig()))
    yield svc
    svc.engine.dispose()


def spec(name: str, gpus: int = 1) -> JobSpec:
    return JobSpec.model_validate({"name": name, "expected_runtime": "1h",
                                   "roles": [{"name": "w", "gpus": gpus}]})


class Inserts:
    """The INSERT INTO jobs statements the service sends while counting."""

    def __init__(self, engine):
        self.engine, self.count = engine, 0

    def __enter__(self):
        event.listen(self.engine, "before_cursor_execute", self._one)
        return self

    def __exit__(self, *exc):
        event.remove(self.engine, "before_cursor_execute", self._one)

    def _one(self, conn, cursor, statement, params, context, executemany):
        self.count += statement.lstrip().startswith("INSERT INTO jobs")


def stored(service: Service) -> int:
    with service.reads() as s:
        return s.scalar(select(func.count()).select_from(JobRow))


def test_a_burst_of_submits_is_one_insert(service):
    async def burst():
        return await asyncio.gather(*(submits.submit(service, spec(f"j{i}"), VISION, f"k{i}")
                                      for i in range(20)))

    service.wake.clear()
    with Inserts(service.engine) as inserts:
        out = asyncio.run(burst())
    assert inserts.count == 1
    assert all(created for _, created in out) and len({r.id for r, _ in out}) == 20
    assert stored(service) == 20 and service.wake.is_set()
    # retries of the burst, keys and specs the same: the jobs created first, none new
    again = asyncio.run(burst())
    assert [r.id for r, _ in again] == [r.id for r, _ in out]
    assert not any(created for _, created in again) and stored(service) == 20


def test_one_key_sent_at_once_by_many_creates_one_job(service):
    async def same():
        return await asyncio.gather(*(submits.submit(service, spec("train"), VISION, "k")
                                      for _ in range(8)))

    out = asyncio.run(same())
    assert [created for _, created in out] == [True] + [False] * 7
    assert len({r.id for r, _ in out}) == 1 and stored(service) == 1


def test_each_caller_of_a_batch_gets_its_own_answer(service):
    asks = [(spec("a"), VISION, "ka"),
            (spec("a"), VISION, "ka"),                 # the same key and spec: a retry
            (spec("other"), VISION, "ka"),             # the same key, another spec
            (spec("huge", gpus=64), VISION, None),     # never fits two 8-GPU hosts
            (spec("theirs").model_copy(update={"team": "nlp"}), VISION, None),
            (spec("b"), VISION, None)]
    with Inserts(service.engine) as inserts:
        a, a_again, other, huge, theirs, b = jobs.submit_many(service, asks)
    assert a[1] and not a_again[1] and a_again[0].id == a[0].id
    assert isinstance(other, Conflict) and "another spec" in str(other)
    assert isinstance(huge, Rejected) and isinstance(theirs, Forbidden)
    assert b[1] and b[0].team == "vision" and stored(service) == 2
    assert inserts.count == 1 + 2      # a and b together, then the two reusing a's key


def test_a_batch_the_database_refuses_goes_job_by_job(service, db_url):
    (first, _), = jobs.submit_many(service, [(spec("old"), VISION, "seen")])
    asks = [(spec("old"), VISION, "seen"),             # a key stored before the batch
            (spec("c"), VISION, None),
            (spec("nul"), VISION, "k\x00ey")]          # PostgreSQL text holds no NUL
    with Inserts(service.engine) as inserts:
        old, c, nul = jobs.submit_many(service, asks)
    assert inserts.count == 1 + 3      # the batch's insert, refused; then each alone
    assert (old[0].id, old[1]) == (first.id, False)
    assert c[1]
    if db_url.startswith("postgresql"):
        assert type(nul).__name__ == "DataError" and stored(service) == 2
    else:
        assert nul[1] and stored(service) == 3
