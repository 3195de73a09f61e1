"""A pass reads only the job rows changed since its last read (migration 0023's `changed`,
service/warm.py `_revisions`), never missing one: the revisions the leader keeps equal the
store's after every kind of change, by the API or behind its back, and on PostgreSQL a
change whose transaction began before a pass's read and committed after it is read by the
next pass. SQLite and PostgreSQL, the real app."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_gpu.scheduler_core.service.warm import MEMBER, Warm, _revisions
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import serve
from tests.scheduler_core.store.test_bad_rows import auth, submit


@pytest.fixture
def api(db_url):
    yield from serve(db_url)


def store_revs(api) -> dict[str, int]:
    with Session(api.service.engine) as s:
        return dict(s.execute(select(JobRow.id, JobRow.rev).where(MEMBER)).all())


def changed_since_last_read(api) -> list[str]:
    with Session(api.service.engine) as s:
        return list(s.scalars(select(JobRow.id).where(
            JobRow.changed >= api.service.warm.mark)))


def behind(api, sql: str) -> None:
    """A plain statement behind the service's back (as a tool or a hand would)."""
    with api.service.engine.begin() as conn:
        conn.exec_driver_sql(sql)


def post(api, path: str, **body) -> dict:
    r = api.post(path, headers=auth(api, "vision"), json=body or None)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_revisions_kept_equal_the_stores_after_every_kind_of_change(api):
    ids = [submit(api, f"j{i}", 4) for i in range(8)]       # 16 GPUs: 4 start
    api.tick()                  # the leader's first pass: reads everything
    steps = [
        lambda: post(api, f"/api/v1/jobs/{ids[0]}/heartbeat"),          # started
        lambda: post(api, f"/api/v1/jobs/{ids[1]}/heartbeat"),
        lambda: post(api, f"/api/v1/jobs/{ids[0]}/heartbeat"),          # lease only
        lambda: post(api, f"/api/v1/jobs/{ids[0]}/finish", outcome="succeeded"),
        lambda: api.delete(f"/api/v1/jobs/{ids[7]}", headers=auth(api, "vision")),
        lambda: post(api, f"/api/v1/jobs/{ids[6]}/hold"),               # leaves the set
        lambda: post(api, f"/api/v1/jobs/{ids[6]}/release"),            # comes back
        lambda: submit(api, "late", 1),                                 # a new row
        lambda: behind(api, f"UPDATE jobs SET priority = 9 WHERE id = '{ids[5]}'"),
    ]
    for step in steps:
        step()
        api.tick()
        assert api.service.rebuilt == []          # kept up to date, never read anew
        # what the next pass's read makes of the revisions kept (the pass's own writes,
        # reasons and admissions, included) is what a full read finds, in one snapshot
        with api.service.snapshot() as s:
            kept = Warm(api.service.cluster)
            kept.revs, kept.mark = dict(api.service.warm.revs), api.service.warm.mark
            assert _revisions(s, kept) == dict(s.execute(
                select(JobRow.id, JobRow.rev).where(MEMBER)).all())


def test_a_row_is_marked_changed_only_by_what_the_leader_reads(api):
    ids = [submit(api, f"j{i}", 8) for i in range(4)]        # two start, two wait
    api.tick()
    post(api, f"/api/v1/jobs/{ids[0]}/heartbeat")
    api.tick()
    api.tick()                 # the reasons written and read back: nothing changes now
    before = marks(api)
    post(api, f"/api/v1/jobs/{ids[0]}/heartbeat")          # a lease: not a change
    assert marks(api) == before
    behind(api, f"UPDATE jobs SET priority = 3 WHERE id = '{ids[3]}'")   # behind its back
    after = marks(api)
    assert [i for i in ids if after[i] != before[i]] == [ids[3]]
    assert after[ids[3]] >= api.service.warm.mark           # so the next read takes it
    assert ids[3] in changed_since_last_read(api)


def marks(api) -> dict[str, int]:
    with Session(api.service.engine) as s:
        return dict(s.execute(select(JobRow.id, JobRow.changed)).all())


def test_a_change_committed_after_a_pass_read_is_read_by_the_next_pass(pg_api):
    api = pg_api
    a, b = (submit(api, f"j{i}", 8) for i in range(2))
    assert set(api.tick()) == {a, b}
    post(api, f"/api/v1/jobs/{a}/heartbeat")
    api.tick()
    before = store_revs(api)[a]
    with api.service.engine.connect() as conn:
        writing = conn.begin()         # begun (its transaction id taken) before the read
        conn.exec_driver_sql(f"UPDATE jobs SET priority = 7 WHERE id = '{a}'")
        behind(api, f"UPDATE jobs SET priority = 1 WHERE id = '{b}'")   # a later one,
        api.tick()                     # committed first; the read sees it, not a's
        assert api.service.warm.revs[a] == before
        writing.commit()
    assert store_revs(api)[a] == before + 1
    api.tick()                         # its mark is below the change's: read
    assert api.service.warm.revs[a] == before + 1
    assert api.service.warm.jobs[a].rev == before + 1     # and the row read again


@pytest.fixture
def pg_api(db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer at a time: its commits come in order")
    yield from serve(db_url)
