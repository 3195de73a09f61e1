"""The store on SQLite and on the real PostgreSQL: migrations, and the database itself
refusing a double booking."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from airflow_gpu.scheduler_core.store.db import current_revision, make_engine, sessions, upgrade
from airflow_gpu.scheduler_core.store.models import (
    Base,
    CpuHoldRow,
    GpuHoldRow,
    HostRow,
    JobRow,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def engine(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
    yield engine
    engine.dispose()


def _job(job_id: str, key: str | None = None, team: str = "vision") -> JobRow:
    return JobRow(id=job_id, name=job_id, team=team, idempotency_key=key, spec={},
                  state="pending", submitted_at=NOW)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from airflow_gpu.scheduler_core.store.db import MIGRATIONS

    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def test_each_migration_is_named_after_its_revision_so_the_head_is_read_without_alembic(
        empty_db_url):
    from alembic.script import ScriptDirectory

    from airflow_gpu.scheduler_core.store import db

    scripts = ScriptDirectory(str(db.MIGRATIONS))
    for rev in scripts.walk_revisions():
        assert rev.path.rsplit("/", 1)[-1].split("_", 1)[0] == rev.revision, rev.path
    assert db.head_revision() == head_revision()
    engine = make_engine(empty_db_url)
    assert not db.at_revision(engine, head_revision())      # no schema yet
    upgrade(engine, "0013")
    assert not db.at_revision(engine, head_revision())
    upgrade(engine)                                          # the last step still runs
    assert db.at_revision(engine, head_revision())
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_migrations_match_the_models_and_rerun_cleanly(engine):
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    upgrade(engine)   # already at head: nothing to do, nothing breaks
    assert current_revision(engine) == head_revision()


@pytest.mark.parametrize("hold", [
    lambda job: GpuHoldRow(host="dgx-1", gpu=3, job_id=job),
    lambda job: CpuHoldRow(host="dgx-1", cpu=17, job_id=job),
])
def test_the_database_refuses_a_double_booking(engine, hold):
    make = sessions(engine)
    with make.begin() as s:
        s.add(HostRow(name="dgx-1", model="dgx-a100", rack="r1", switch="s1"))
        s.add_all([_job("a"), _job("b")])
    with make.begin() as s:
        s.add(hold("a"))
    with pytest.raises(IntegrityError), make.begin() as s:
        s.add(hold("b"))
    with make() as s:   # the first holder keeps it
        assert list(s.scalars(select(type(hold("x")).job_id))) == ["a"]


def test_a_hold_needs_a_real_host_and_job(engine):
    make = sessions(engine)
    with pytest.raises(IntegrityError), make.begin() as s:
        s.add(GpuHoldRow(host="nowhere", gpu=0, job_id="nobody"))


def test_idempotency_key_is_unique_per_team(engine):
    make = sessions(engine)
    with make.begin() as s:
        s.add_all([_job("a", "k1"), _job("b", "k1", team="nlp"), _job("c"), _job("d")])
    with pytest.raises(IntegrityError), make.begin() as s:
        s.add(_job("e", "k1"))


def test_bad_url_is_a_clear_error():
    from airflow_gpu.scheduler_core.errors import InputError

    with pytest.raises(InputError, match="--db: 'mysql://x' is not a SQLite or PostgreSQL"):
        make_engine("mysql://x")
