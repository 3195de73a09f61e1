"""Scheduler answers for the plugin's page tests without a server: a small cluster,
live and pending jobs as the service's JSON gives them, and a source that serves them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient

from airflow_gpu.plugin.app import create_app
from airflow_gpu.plugin.auth import require_login
from airflow_gpu.plugin.source import SourceError

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def at(minutes_ago: float) -> str:
    return (NOW - timedelta(minutes=minutes_ago)).isoformat()


def gpu(index: int, numa: int, job: str | None = None, team: str | None = None,
        healthy: bool = True, **extra) -> dict:
    return {"index": index, "name": "NVIDIA A100", "numa_node": numa, "healthy": healthy,
            "health_reason": None if healthy else "XID 79", "job": job, "team": team,
            **extra}


def host(name: str, rack: str, switch: str, gpus: list[dict], **extra) -> dict:
    return {"name": name, "model": "dgx-1v", "rack": rack, "switch": switch,
            "drained": False, "nvlink": {"fabric": "direct", "groups": [[0, 1], [2, 3]]},
            "gpus": gpus, **extra}


CLUSTER = {"cluster": "c", "hosts": [
    host("a", "r1", "s1", [gpu(0, 0, "j1", "vision", utilization_gpu=87.4,
                               utilization_memory=40.0, power_watts=250.0),
                           gpu(1, 0, "j1", "vision"), gpu(2, 1), gpu(3, 1, healthy=False)]),
    host("b", "r1", "s2", [gpu(0, 0), gpu(1, 0), gpu(2, 1), gpu(3, 1)], reachable=False),
    host("c", "r2", "s3", [gpu(0, 0), gpu(1, 0), gpu(2, 1), gpu(3, 1)], drained=True,
         drain_reason="PSU swap"),
]}
LIVE = [{"id": "j1", "name": "train", "team": "vision", "state": "running", "priority": 0,
         "spec": {"roles": [{"name": "w", "gpus": 2}], "expected_runtime": "1h"},
         "submitted_at": at(30), "admitted_at": at(20), "started_at": at(20),
         "finished_at": None, "replicas": [{"role": "w", "index": 0, "host": "a",
                                             "gpus": [0, 1], "cpus": [0, 1, 2, 3],
                                             "memory_by_numa": {"0": 2**30},
                                             "nics": ["mlx5_0"], "live": True}]}]


def pending(name: str, priority: int, minutes_ago: float, rank: int | None = None,
            band: float | None = None, score: float | None = None, **why) -> dict:
    return {"id": f"id-{name}", "name": name, "team": "nlp", "state": "pending",
            "rank": rank, "band": band, "score": score,
            "priority": priority, "spec": {"roles": [{"name": "w", "gpus": 4}]},
            "submitted_at": at(minutes_ago), "admitted_at": None, "started_at": None,
            "finished_at": None, "replicas": [],
            "pending": {"code": "Resources", "reason": "held by j1 (2)",
                        "details": {"held_by": {"j1": 2}}, "eta_seconds": 600, **why}}


class FakeSource:
    """What the scheduler would answer, for rendering without one (`usage` None: a
    service older than accounting, which has no usage endpoint)."""

    def __init__(self, fail: SourceError | None = None, live: list[dict] = LIVE,
                 pending: list[dict] = (), job: dict = LIVE[0], usage: dict | None = None):
        self.fail, self.live, self.pending, self.one = fail, live, list(pending), job
        self.used = usage

    def _answer(self, value):
        if self.fail:
            raise self.fail
        return value

    def cluster(self):
        return self._answer(CLUSTER)

    def live_jobs(self):
        return self._answer(self.live)

    def queue(self):
        return self._answer(self.pending)

    def jobs(self, state=None, newest=False, limit=1000):
        if state == "pending":
            return self._answer(self.pending)
        return self._answer(self.live if state in (None, "running") else [])

    def job(self, job_id):
        return self._answer(self.one)

    def usage(self, job_id):
        if self.used is None:
            raise SourceError(404, "Not Found")
        return self._answer(self.used)

    def explain(self, job_id):
        return self._answer({"code": None, "reason": None, "eta_seconds": None,
                             "details": {}, "events": []})

    def teams(self):
        return self._answer([{"name": "vision", "share": 1.0, "quota_gpus": None,
                              "held_gpus": 2}])


def client(source) -> TestClient:
    app = create_app(source)
    app.dependency_overrides[require_login] = lambda: None
    return TestClient(app)
