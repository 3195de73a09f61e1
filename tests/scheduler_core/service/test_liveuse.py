"""The leader keeps the running jobs' fair-share usage between passes (service/liveuse.py)
instead of walking every running job in every pass: after starts, ends, a row changed
behind its back and a move of its reference time, a pass's fair share equals the one
built from the store by walking every live job (what `prio` builds: storepass.past_usage).
SQLite and PostgreSQL, the real app."""

from __future__ import annotations

import math
import time

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from airflow_gpu.scheduler_core.policy.fairshare import FairShare
from airflow_gpu.scheduler_core.policy.types import account
from airflow_gpu.scheduler_core.service.common import LIVE, spec_gpus
from airflow_gpu.scheduler_core.service.storepass import past_usage
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import serve
from tests.scheduler_core.store.test_bad_rows import auth, job, submit


@pytest.fixture
def api(db_url):
    yield from serve(db_url)


def same_as_the_store(api) -> dict[str, float]:
    """The last pass's fair share against one built from the store at the same time;
    returns its usage."""
    fs = api.service.warm.sched.fairshare
    fresh = FairShare(fs.config, fs.now)
    with Session(api.service.engine) as s:
        live = list(s.scalars(select(JobRow).where(JobRow.state.in_(LIVE))))
        past_usage(api.service, s, fresh, fs.now, live)
    assert fs.usage.keys() == fresh.usage.keys()
    for acct, used in fresh.usage.items():
        assert math.isclose(fs.usage[acct], used, rel_tol=1e-9, abs_tol=1e-6), acct
    held: dict[str, int] = {}
    for row in live:
        a = account(row.team, row.user)
        held[a] = held.get(a, 0) + spec_gpus(row.spec)
    assert fs.running == held
    return fs.usage


def test_the_running_jobs_usage_kept_between_passes_equals_a_walk_of_the_store(api):
    ids = [submit(api, f"v{g}", g) for g in (1, 2, 4)]
    api.post("/api/v1/jobs", headers=auth(api, "nlp"), json={"spec": {
        "name": "n", "expected_runtime": "1h", "roles": [{"name": "w", "gpus": 8}]}})
    assert len(api.tick()) == 4
    time.sleep(0.5)
    api.tick()                                   # restored from the rows read again
    first = same_as_the_store(api)
    assert first["vision"] > 0 and first["nlp"] > 0
    # one ends, another starts
    done = ids.pop(0)
    for path in ("heartbeat", "finish"):
        api.post(f"/api/v1/jobs/{done}/{path}", headers=auth(api),
                 json={"outcome": "succeeded"} if path == "finish" else {})
    ids.append(submit(api, "v1b", 1))
    api.tick()
    assert job(api, ids[-1])["state"] == "admitted"
    time.sleep(0.2)
    api.tick()
    same_as_the_store(api)
    # a running job's row changed behind the leader's back: read again, counted anew
    with Session(api.service.engine) as s, s.begin():
        started = s.get(JobRow, ids[0]).admitted_at
        s.execute(update(JobRow).where(JobRow.id == ids[0]).values(
            admitted_at=started.replace(year=started.year - 1)))
    api.tick()
    assert same_as_the_store(api)["vision"] > first["vision"] * 1000
    # the reference time moves on after a half-life: the sums are built anew
    live = api.service.warm.live
    live.t0 -= 2 * live.half_life
    api.tick()
    assert api.service.warm.live is live and live.t0 > time.time() - 60
    same_as_the_store(api)
