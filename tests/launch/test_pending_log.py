"""A waiting job's pending reason is logged when its code, blockers or placement change,
not at every poll because a countdown in it changed ("reserve_after (2d23h59m58s from
now)" differs at every scheduling pass): by `airflow-gpu run` (stderr, not a terminal)
and by the Airflow trigger (the task log). A real service on SQLite."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from airflow_gpu.scheduler_core.reasonkey import reason_key
from airflow_gpu.triggers.admission import AdmissionTrigger
from tests.helpers import until
from tests.launch.runserver import serve
from tests.launch.test_run_cli import SMALL, start

COUNTDOWN = 3        # seconds of polls during which only the countdown changes


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("pending-log"), lease_ttl=600) as server:
        yield server


@pytest.fixture(autouse=True)
def nothing_left(server):
    """Each test starts on a free host, whatever the last one left holding."""
    yield
    for live in ("pending", "admitted", "running"):
        for j in server["admin"].get("/api/v1/jobs", params={"state": live}).json():
            server["admin"].delete(f"/api/v1/jobs/{j['id']}")


def submit(server, name: str, gpus: int) -> str:
    spec = {"name": name, "expected_runtime": "10m",
            "roles": [{"name": "m", "gpus": gpus, "cpus": 1, "memory": "64MiB"}]}
    got = server["team"].post("/api/v1/jobs", json={"spec": spec})
    assert got.status_code < 300, got.text
    return got.json()["id"]


def state(server, job_id: str) -> str:
    return server["team"].get(f"/api/v1/jobs/{job_id}").json()["state"]


def holders(server) -> tuple[str, str]:
    """Two jobs holding 2 of the host's 4 GPUs each (no launcher: they keep them until
    cancelled, within the long lease)."""
    first, second = submit(server, "first", 2), submit(server, "second", 2)
    until(lambda: state(server, first) == state(server, second) == "admitted",
          "the holders to be admitted", 60)
    return first, second


def cancel(server, job_id: str) -> None:
    server["team"].delete(f"/api/v1/jobs/{job_id}").raise_for_status()


def test_the_key_ignores_countdowns_and_sees_blockers_and_placement():
    def job(reason: str, **details) -> dict:
        return {"state": "pending", "pending": {"code": "Resources", "reason": reason,
                                                "details": details, "eta_seconds": 9}}
    waiting = job("held by a (4); reserve_after (2d23h59m58s from now)",
                  held_by={"a": 4}, protected_in_s=259198)
    assert reason_key(waiting) == reason_key(
        job("held by a (4); reserve_after (2d23h59m57s from now)", held_by={"a": 4},
            protected_in_s=259197))
    assert reason_key(waiting) != reason_key(job("held by b (4)", held_by={"b": 4}))
    assert reason_key(waiting) != reason_key(job("", held_by={"a": 4},
                                                 reserved_hosts=["host-1"]))
    assert reason_key(waiting) != reason_key({**waiting, "state": "preempting"})


def _resources_lines(err: Path) -> list[str]:
    return [line for line in err.read_text().splitlines() if "pending: Resources" in line]


def test_run_logs_the_reason_once_while_only_its_countdown_changes(server):
    first, second = holders(server)
    proc, _, err = start(server, "waiter", "--gpus", "3", *SMALL, "--", "true")
    try:
        until(lambda: _resources_lines(err), "the pending reason on stderr", 60)
        time.sleep(COUNTDOWN)
        (line,) = _resources_lines(err)
        assert f"({first[:8]})" in line and f"({second[:8]})" in line, line
        cancel(server, first)               # one blocker left: said again
        until(lambda: len(_resources_lines(err)) == 2, "the changed reason", 30)
        changed = _resources_lines(err)[1]
        assert f"({second[:8]})" in changed and first[:8] not in changed, changed
        time.sleep(COUNTDOWN)
        assert len(_resources_lines(err)) == 2, err.read_text()
        cancel(server, second)              # admitted: the command runs
        assert proc.wait(60) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_trigger_logs_the_reason_once_while_only_its_countdown_changes(
        server, monkeypatch, capsys):
    host, port = server["url"].removeprefix("http://").split(":")
    monkeypatch.setenv("AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT", json.dumps(
        {"conn_type": "gpu_scheduler", "host": host, "port": int(port),
         "password": server["token"]}))
    first, second = holders(server)
    waiting = submit(server, "waiting", 3)
    trigger = AdmissionTrigger(waiting, poll_interval=0.2)
    said: list[str] = []

    def reasons() -> list[str]:
        said.extend(re.findall(r"waiting for GPUs: needs .*", capsys.readouterr().out))
        return said

    async def scenario() -> dict:
        event = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.sleep(COUNTDOWN)
        assert len(reasons()) == 1 and f"({first[:8]})" in said[0] \
            and f"({second[:8]})" in said[0], said
        await asyncio.to_thread(cancel, server, first)
        await asyncio.sleep(COUNTDOWN)
        assert len(reasons()) == 2 and first[:8] not in said[1], said
        await asyncio.to_thread(cancel, server, second)
        return (await asyncio.wait_for(event, 30)).payload

    assert asyncio.run(scenario())["status"] == "admitted"
