"""Prometheus gauges of the queue through the real service (SQLite and PostgreSQL):
pending jobs by reason, the queue wait of admitted jobs, drained hosts, quota use."""

from __future__ import annotations

from tests.scheduler_core.api.test_api import auth, spec, submit


def test_pending_reasons_waits_drained_hosts_and_quota_use(api):
    r = api.put("/api/v1/teams/vision", json={"quota_gpus": 16, "borrow_gpus": 8},
                headers=auth(api, "admin"))
    assert r.status_code == 200, r.text
    for name in ("a", "b", "c"):
        submit(api, "vision", spec(name, 8))
    submit(api, "nlp", spec("d", 8))
    api.tick()
    api.tick()               # the pending jobs' reasons are written by the pass
    assert api.post("/api/v1/hosts/dgx-2/drain", headers=auth(api, "admin")).status_code \
        == 200
    text = api.get("/metrics").text
    assert 'airflow_gpu_pending_jobs{reason="Resources",team="vision"} 1.0' in text
    assert 'airflow_gpu_pending_jobs{reason="Resources",team="nlp"} 1.0' in text
    assert "airflow_gpu_queue_wait_seconds_count 2.0" in text
    assert 'airflow_gpu_host_drained{host="dgx-2"} 1.0' in text
    assert 'airflow_gpu_host_drained{host="dgx-1"} 0.0' in text
    assert 'airflow_gpu_team_quota_gpus{team="vision"} 16.0' in text
    assert 'airflow_gpu_team_gpus_held{team="vision"} 16.0' in text
    assert 'airflow_gpu_team_gpus_borrowed{team="vision"} 0.0' in text
