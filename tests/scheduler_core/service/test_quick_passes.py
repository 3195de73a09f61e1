"""A pass woken by a finish gives the freed GPUs away without working out why every other
job waits, when that takes long (a long queue: loop.QUICK_AFTER); the reasons are brought
up to date by a pass at most EXPLAIN_EVERY seconds later. The real loop on its store."""

from __future__ import annotations

import time

from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.service.core import Principal, Service, Settings
from airflow_gpu.scheduler_core.service.loop import SchedulerLoop
from tests.databases import HOSTS
from tests.helpers import make_cluster, until


def spec(name: str) -> JobSpec:
    return JobSpec.model_validate({"name": name, "expected_runtime": "1h",
                                   "roles": [{"name": "w", "gpus": 8}]})


def test_a_woken_pass_admits_at_once_and_the_reasons_follow(db_url, monkeypatch):
    monkeypatch.setattr(SchedulerLoop, "QUICK_AFTER", -1.0)   # as if the queue were long
    monkeypatch.setattr(SchedulerLoop, "EXPLAIN_EVERY", 1.5)
    service = Service(Settings(db_url, make_cluster(*HOSTS), lease_ttl=600))
    vision = Principal("vision")
    loop = SchedulerLoop(service, interval=30)     # no pass but the woken and the due
    try:
        a, b = (service.submit(spec(n), vision)[0].id for n in ("a", "b"))
        assert set(loop.tick()) == {a, b}          # the two hosts are full
        c, d = (service.submit(spec(n), vision)[0].id for n in ("c", "d"))
        loop.tick()
        assert service.get(c).reason_code == service.get(d).reason_code == "Resources"
        for job_id in (a, b):
            service.heartbeat(job_id, vision)
        ticks = loop.passes
        loop.start()
        until(lambda: loop.passes > ticks, "the loop's first pass")  # explained: not woken
        time.sleep(0.2)
        before = {i: service.get(i).rev for i in (c, d)}
        service.finish(a, vision, "succeeded", 0)  # wakes the loop
        first = until(lambda: next((i for i in (c, d) if service.get(i).state == "admitted"),
                                   None), "the freed host's next job is admitted")
        other = d if first == c else c
        stale = service.get(other)
        woken = time.monotonic()
        # the woken pass left the reasons as they were (its write was the admission
        # alone); the explained pass rewrites them, at most EXPLAIN_EVERY later
        assert stale.rev == before[other] and stale.reason_code == "Resources"
        until(lambda: service.get(other).rev != stale.rev, "the reasons brought up to date",
              timeout=10)
        assert time.monotonic() - woken < 10
        assert service.get(other).state == "pending"
    finally:
        loop.stop()
        service.engine.dispose()
