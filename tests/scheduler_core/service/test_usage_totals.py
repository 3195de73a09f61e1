"""Fair share's running totals of ended jobs' usage (service/usage.py) against the sum
over every ended job, read afresh, through the real store (SQLite and PostgreSQL): equal
after jobs end between passes, with a job whose end committed after a read that it
precedes counted once, and never a job counted twice."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.fairshare import FairShare
from airflow_gpu.scheduler_core.service.storepass import past_usage
from airflow_gpu.scheduler_core.service.usage import MARGIN
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.scheduler_core.api.test_api import spec, submit

DAY = 86400.0


def ended(api, team: str, gpus: int, start: float, end: float) -> str:
    """A job of `team` that ran `gpus` GPUs from `start` to `end` (epoch seconds)."""
    r = submit(api, team, spec(f"{team}-{start:.0f}", gpus))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    with api.service.sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(
            state="succeeded", outcome="succeeded",
            admitted_at=datetime.fromtimestamp(start, UTC),
            finished_at=datetime.fromtimestamp(end, UTC)))
    return job_id


def totals(api, t_now: float) -> dict[str, float]:
    fs = FairShare(PolicyConfig(), now=t_now)
    with api.service.reads() as s:
        past_usage(api.service, s, fs, t_now, [])
    return fs.usage


def exact(jobs: list[tuple[str, int, float, float]], t_now: float) -> dict[str, float]:
    fs = FairShare(PolicyConfig(), now=t_now)
    for team, gpus, start, end in jobs:
        if end > t_now - 5 * PolicyConfig().fairshare_half_life:
            fs.add_past(team, gpus, start, end)
    return fs.usage


def same(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want), (got, want)
    for team in want:
        assert math.isclose(got[team], want[team], rel_tol=1e-9), (team, got, want)


@pytest.mark.timeout(120)
def test_running_totals_equal_a_fresh_sum_as_jobs_end(api):
    now = datetime.now(UTC).timestamp()
    jobs = [("vision", 8, now - 3 * DAY, now - 2 * DAY), ("nlp", 4, now - DAY, now - 3600),
            ("vision", 2, now - 7200, now - 600)]
    for job in jobs:
        ended(api, *job)
    t1 = now
    same(totals(api, t1), exact(jobs, t1))

    # ended since: one before the last read but committed after it (within the margin)
    late = ("nlp", 8, t1 - 4000, t1 - MARGIN / 2)
    fresh = ("vision", 1, t1 - 100, t1 + 50)
    for job in (late, fresh):
        ended(api, *job)
        jobs.append(job)
    t2 = t1 + 120
    same(totals(api, t2), exact(jobs, t2))
    # read again with nothing new: decayed only, nothing counted twice
    t3 = t2 + DAY
    same(totals(api, t3), exact(jobs, t3))
    assert totals(api, t3)["nlp"] < totals(api, t2)["nlp"]      # it decays
