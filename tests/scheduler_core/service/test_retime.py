"""A changed time model is taken in job by job (service/retime.py), not by building the
engine anew: once the learned model changed and MODEL_EVERY passed, the running and
queued jobs are planned with the new factors over the next passes, and the engine then
plans every job as one built anew from the store does. SQLite and PostgreSQL, the real
app."""

from __future__ import annotations

import time

import pytest

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service import retime
from airflow_gpu.scheduler_core.service.retime import MODEL_EVERY
from tests.databases import serve
from tests.scheduler_core.store.test_bad_rows import auth, job, submit


@pytest.fixture
def api(db_url):
    yield from serve(db_url, PolicyConfig(correct_estimates="both"))


def plans(api) -> dict[str, float]:
    """What the engine plans each job with: a running job's planned end, a queued job's
    planned runtime."""
    sched = api.service.warm.sched
    return {**{i: sched.state.expected_end[i] for i in sched.running},
            **{i: j.runtime for i, j in sched.queue.jobs.items()}}


@pytest.mark.parametrize("batch", [100, 1])
def test_a_changed_time_model_is_taken_in_over_the_passes_as_a_rebuild_would(
        api, batch, monkeypatch):
    """With batches of one job and no time for more, one job a pass."""
    if batch == 1:
        monkeypatch.setattr(retime, "RETIME_BATCH", 1)
        monkeypatch.setattr(retime, "RETIME_MIN", 0.0)
        monkeypatch.setattr(retime, "RETIME_SHARE", 0.0)
    ids = [submit(api, f"big{i}", 6) for i in range(3)] + [submit(api, "small", 1)]
    api.tick()
    running = [i for i in ids if job(api, i)["state"] == "admitted"]
    assert len(running) == 3                 # two of 6 GPUs and the small one
    # a job of the team ends in a tenth of the time it said: the model learns a factor
    quick = api.post("/api/v1/jobs", headers=auth(api), json={"spec": {
        "name": "quick", "expected_runtime": "10s",
        "roles": [{"name": "w", "gpus": 1}]}}).json()["id"]
    api.tick()
    api.post(f"/api/v1/jobs/{quick}/heartbeat", headers=auth(api), json={})
    time.sleep(1.0)
    api.post(f"/api/v1/jobs/{quick}/finish", headers=auth(api), json={"outcome": "succeeded"})
    api.tick()
    warm = api.service.warm
    sched, before = warm.sched, plans(api)
    assert api.service.slowdown.model.version != warm.tm_version     # learned, not taken in
    warm.built_at -= MODEL_EVERY                                      # it is due
    api.tick()
    assert len(warm.retime) == (3 if batch == 1 else 0)     # 4 left: one a pass
    for _ in range(3):
        api.tick()
    assert warm.retime == [] and warm.tm_version == api.service.slowdown.model.version
    assert api.service.warm is warm and warm.sched is sched          # not built anew
    assert api.service.rebuilt == []
    after = plans(api)
    assert after.keys() == before.keys() and all(after[i] != before[i] for i in after)
    # the same as an engine built anew from the store with the same model
    api.service.warm = None
    api.tick()
    assert api.service.rebuilt == ["leader"]
    assert plans(api) == pytest.approx(after)
