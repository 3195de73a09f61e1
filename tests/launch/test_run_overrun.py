"""`airflow-gpu run` as a user runs it, on a real server, when a backfilled command overruns
its estimate: one host of 4 GPUs; `holder` (2 GPUs, 6 s expected) runs; `big` (4 GPUs) is
protected at once (reserve_after 0) and reserved from holder's planned end; `liar` says
1 s and runs on. At the reservation it is stopped (SIGTERM), requeued under the same id,
`big` starts first, then liar runs again and ends: never `timeout`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO, until
from tests.launch.test_run_cli import SMALL, run_server

LIAR = ('echo attempt $AIRFLOW_GPU_ATTEMPT $AIRFLOW_GPU_REQUEUE_REASON; '
        '[ "$AIRFLOW_GPU_RESTARTED" = 1 ] && exit 0; exec sleep 300')


@pytest.fixture(params=[10, 120], ids=["lease-10s", "lease-120s"])
def server(tmp_path, request):
    """A short lease, and one long enough that a launcher beating a third of it would
    hear of the stop only after its 5 s grace: it beats within the grace instead."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("reserve_after: 0\nstop_grace: 5\n")
    with run_server(tmp_path, request.param, "--policy-file", str(policy)) as srv:
        yield srv


def start(server, name: str, *args: str) -> subprocess.Popen:
    out, err = (server["tmp"] / f"{name}.{k}" for k in ("out", "err"))
    return subprocess.Popen([sys.executable, "-m", "airflow_gpu.cli", "run", "--name", name,
                             *SMALL, *args], cwd=REPO, env=server["env"],
                            stdout=out.open("w"), stderr=err.open("w"))


def text(server, name: str, kind: str) -> str:
    return (server["tmp"] / f"{name}.{kind}").read_text()


def jobs(server) -> dict:
    return {j["name"]: j for j in server["admin"].get("/api/v1/jobs").json()}


def test_an_overrunning_backfilled_command_is_requeued_and_runs_again(server):
    procs = {"holder": start(server, "holder", "--gpus", "2", "--expected-runtime", "6s",
                             "--", "sleep", "6")}
    until(lambda: jobs(server).get("holder", {}).get("state") == "running", "holder runs")
    procs["big"] = start(server, "big", "--gpus", "4", "--expected-runtime", "1m", "--",
                         "true")
    until(lambda: "held by holder" in text(server, "big", "err"), "big waits for holder")
    procs["liar"] = start(server, "liar", "--gpus", "2", "--expected-runtime", "1s", "--",
                          "sh", "-c", LIAR)
    try:
        for name, p in procs.items():
            assert p.wait(timeout=90) == 0, (name, text(server, name, "err"),
                                              server["log"].read_text())
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    got = jobs(server)
    liar, big = got["liar"], got["big"]
    assert (liar["state"], liar["attempt"], liar["requeue_reason"]) == (
        "succeeded", 2, "overrun")
    assert text(server, "liar", "out").split("\n")[:2] == ["attempt 1", "attempt 2 overrun"]
    said = text(server, "liar", "err")
    assert "stopped: overran its expected runtime of 1s (ran " in said and big["id"][:8] in said
    assert "sending SIGTERM to all replicas, SIGKILL after 5s" in said
    events = server["admin"].get(f"/api/v1/jobs/{liar['id']}/explain").json()["events"]
    kinds = [e["kind"] for e in events]
    first = next(e["message"] for e in events if e["kind"] == "admitted")
    assert f"backfills ahead of the reservation for job {big['id'][:8]}:" in first
    assert "timeout" not in kinds and kinds.count("overrun") == 1, kinds
    # the reserved job started before the overrunner's second admission
    second = [e["at"] for e in events if e["kind"] == "admitted"][1]
    big_events = server["admin"].get(f"/api/v1/jobs/{big['id']}/explain").json()["events"]
    assert next(e["at"] for e in big_events if e["kind"] == "admitted") < second
