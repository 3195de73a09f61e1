"""Deadlines: the spec's fields, a queued job's latest start."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.errors import InputError, validate
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from tests.helpers import job, make_cluster

ONE_HOST = ({"name": "dgx-1", "model": "dgx-a100"},)
ROLES = [{"name": "w", "gpus": 1}]


def _spec(**fields) -> JobSpec:
    return validate(JobSpec, {"name": "j", "roles": ROLES, **fields}, "job.yaml")


def test_spec_deadline_and_downstream():
    spec = _spec(deadline="2026-12-05T06:00:00Z", downstream="2h")
    assert spec.deadline == datetime(2026, 12, 5, 6, tzinfo=UTC)
    assert spec.downstream == 7200
    assert _spec(deadline="2026-12-05T07:00:00+01:00").deadline == spec.deadline
    assert _spec(deadline=datetime(2026, 12, 5, 6, tzinfo=UTC)).deadline == spec.deadline
    assert _spec(downstream=90).downstream == 90
    plain = _spec()
    assert plain.deadline is None and plain.downstream == 0
    # stored as JSON and read back (the service's rows)
    again = JobSpec.model_validate(spec.model_dump(mode="json"))
    assert again.deadline == spec.deadline and again.downstream == 7200


@pytest.mark.parametrize("fields,words", [
    ({"deadline": "2026-12-05T06:00:00"}, ["deadline:", "2026-12-05T06:00:00", "no time zone",
                                           "2026-12-05T06:00:00Z"]),
    ({"deadline": "tomorrow"}, ["deadline:", "'tomorrow'", "2026-12-05T06:00:00Z"]),
    ({"deadline": 5}, ["deadline:", "time zone"]),
    ({"downstream": "-2h"}, ["downstream:", "'-2h'", "negative"]),
    ({"downstream": "soon"}, ["downstream:", "'soon'", "90m"]),
])
def test_spec_deadline_errors_name_the_field_the_value_and_the_fix(fields, words):
    with pytest.raises(InputError) as exc:
        _spec(**fields)
    for w in words:
        assert w in str(exc.value)


def _scheduler(**policy) -> Scheduler:
    return Scheduler(ClusterState(make_cluster(*ONE_HOST)), PolicyConfig(**policy))


def test_latest_start_is_the_deadline_less_runtime_and_downstream():
    s = _scheduler()
    a = s.submit(job("a", *ROLES, expected_runtime=3600, downstream="2h"), 0.0,
                 deadline=20_000.0)
    assert (a.deadline, a.latest_start) == (20_000.0, 20_000.0 - 3600 - 7200)
    b = s.submit(job("b", *ROLES, expected_runtime=3600), 0.0)
    assert b.deadline == math.inf and b.latest_start == math.inf
    # without a clock of its own, the spec's deadline as Unix time (the service's clock)
    when = datetime(2026, 12, 5, 6, tzinfo=UTC)
    c = s.submit(job("c", *ROLES, expected_runtime=600, deadline=when.isoformat()), 0.0)
    assert c.latest_start == when.timestamp() - 600


def test_a_requeued_job_keeps_its_deadline_with_the_work_it_has_left():
    s = _scheduler()
    s.submit(job("a", *ROLES, expected_runtime=3600, downstream=100), 0.0, deadline=10_000.0)
    s.schedule(0.0)
    again = s.requeue("a", 1000.0, runtime=1800)
    assert again.deadline == 10_000.0 and again.latest_start == 10_000.0 - 1800 - 100
