"""Hundreds of deferred GPU tasks in one triggerer: their AdmissionTriggers run in one
event loop (as Airflow's triggerer runs them) against a real `airflow-gpu server` on
SQLite. Each one hears of its admission (its task then runs and finishes the job, which
frees the GPU for the next), and they share one watcher whose long polls stay within
its bound: at most one request per GAP seconds, whatever the number of tasks.

`waves` is also the scenario of bench/deferred_wait.py, which times how soon each task
resumes after its admission."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

import httpx
import pytest

from airflow_gpu.triggers import watch
from airflow_gpu.triggers.admission import AdmissionTrigger
from tests.servers import Server, prepared

CLUSTER = {"cluster": "deferred", "hosts": [
    {"name": "dgx-[01-08]", "model": "dgx-a100", "rack": "r1", "switch": "s1"}]}   # 64 GPUs


def waves(url: str, token: str, tasks: int) -> dict:
    """`tasks` one-GPU jobs, each awaited by its own AdmissionTrigger in this process's
    one event loop; each admitted job is finished at once (its task "ran"). Returns the
    seconds from each admission (the service's admitted_at) to its trigger's event, the
    watcher's requests and the wall time."""
    auth = {"Authorization": f"Bearer {token}"}
    specs = [{"name": f"deferred-{i}", "expected_runtime": "1m",
              "roles": [{"name": "w", "gpus": 1, "cpus": 1, "memory": "64MiB"}]}
             for i in range(tasks)]
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        ids = []
        for i in range(0, tasks, 200):
            r = c.post("/api/v1/jobs/batch", json={"jobs": [{"spec": s} for s in
                                                            specs[i:i + 200]]})
            assert r.status_code == 201, r.text
            ids += [j["id"] for j in r.json()]

    async def main() -> dict:
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60) as c:
            async def task(job_id: str) -> tuple[str, float]:
                event = await anext(AdmissionTrigger(job_id, poll_interval=5).run())
                heard = time.time()
                assert event.payload["status"] == "admitted", event.payload
                r = await c.post(f"/api/v1/jobs/{job_id}/finish",
                                 json={"outcome": "succeeded"})
                assert r.status_code == 200, r.text
                return job_id, heard

            t0 = time.monotonic()
            heard = dict(await asyncio.gather(*(task(i) for i in ids)))
            wall = time.monotonic() - t0
            watcher = watch.Watcher.of("gpu_scheduler_default")
            admitted = {}
            for i in range(0, len(ids), 500):
                r = await c.post("/api/v1/jobs/wait", json={"ids": ids[i:i + 500],
                                                            "state": "pending",
                                                            "timeout": 0})
                admitted |= {j["id"]: datetime.fromisoformat(j["admitted_at"]).timestamp()
                             for j in r.json()["jobs"]}
            return {"tasks": tasks, "wall_s": wall, "requests": watcher.requests,
                    "watchers": len(watch._watchers[asyncio.get_running_loop()]),
                    "resume_s": sorted(heard[i] - admitted[i] for i in ids)}
    return asyncio.run(main())


@pytest.fixture
def service(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'deferred.db'}"
    _, token, cluster = prepared(db, tmp_path, CLUSTER, "vision")
    server = Server(db, cluster, lease_ttl=600, interval=2.0, log=tmp_path / "server.log")
    host, port = server.url.removeprefix("http://").split(":")
    monkeypatch.setenv("AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT", json.dumps(
        {"conn_type": "gpu_scheduler", "host": host, "port": int(port), "password": token}))
    yield server.url, token
    server.stop()


@pytest.mark.timeout(300)
def test_500_deferred_tasks_share_one_watcher_within_its_bound(service):
    got = waves(*service, 500)
    assert got["watchers"] == 1
    assert len(got["resume_s"]) == 500          # every task heard of its admission
    # one long poll per GAP at most, plus the first of each quiet spell
    bound = got["wall_s"] / watch.GAP + 2
    assert 0 < got["requests"] <= bound, (got["requests"], got["wall_s"])
