"""A maintenance window on the host of a running `airflow-gpu run`, as an admin makes it
and a user sees it, on a real server: the admin is told which job the window will stop,
the command's log says so at once, the window is moved to start in a moment, the host
drains at its start, the command is stopped and its job requeued under the same id, it
waits with ReservedForMaintenance, and the host comes back at the window's end by itself
and the command runs again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO, until
from tests.launch.test_run_cli import SMALL, run_server

AGAIN = ('echo attempt $AIRFLOW_GPU_ATTEMPT $AIRFLOW_GPU_REQUEUE_REASON; '
         '[ "$AIRFLOW_GPU_RESTARTED" = 1 ] && exit 0; exec sleep 300')


@pytest.fixture
def server(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("stop_grace: 2\n")
    with run_server(tmp_path, 10, "--policy-file", str(policy)) as srv:
        yield srv


def test_a_maintenance_window_stops_a_running_command_and_gives_the_host_back(server):
    admin = server["admin"]
    err = server["tmp"] / "train.err"
    proc = subprocess.Popen([sys.executable, "-m", "airflow_gpu.cli", "run", "--name",
                             "train", *SMALL, "--gpus", "1", "--expected-runtime", "2h",
                             "--", "sh", "-c", AGAIN], cwd=REPO, env=server["env"],
                            stdout=(server["tmp"] / "train.out").open("w"),
                            stderr=err.open("w"))
    try:
        def train() -> dict:      # {} until the command has submitted it
            return next((j for j in admin.get("/api/v1/jobs").json()
                         if j["name"] == "train"), {})

        until(lambda: train().get("state") == "running", "the command runs", timeout=30)
        r = admin.post("/api/v1/reservations", json={
            "name": "fw", "hosts": "host-1", "start": "now+1h", "duration": "1h",
            "maint": True})
        assert r.status_code == 201, r.text
        assert [s["name"] for s in r.json()["stops"]] == ["train"]
        until(lambda: "reservation fw starts on its host(s)" in err.read_text(),
              "the command's log says the window will stop it", timeout=20)

        r = admin.patch("/api/v1/reservations/fw", json={"start": "now+2s",
                                                         "duration": "6s"})
        assert r.status_code == 200, r.text
        until(lambda: train()["state"] == "pending", "stopped and requeued at the start",
              timeout=30)
        (host,) = admin.get("/api/v1/cluster").json()["hosts"]
        assert host["drained"] and "maintenance reservation fw" in host["drain_reason"]
        waits = until(lambda: (train().get("pending") or {}).get("code"), "a reason")
        assert waits == "ReservedForMaintenance", train()["pending"]
        assert proc.wait(timeout=60) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    got = train()
    assert (got["state"], got["attempt"], got["requeue_reason"]) == (
        "succeeded", 2, "reservation")
    assert (server["tmp"] / "train.out").read_text().split("\n")[:2] == [
        "attempt 1", "attempt 2 reservation"]
    assert not admin.get("/api/v1/cluster").json()["hosts"][0]["drained"]
    events = admin.get(f"/api/v1/jobs/{got['id']}/explain").json()["events"]
    assert any(e["kind"] == "overrun" and "maintenance reservation fw starts" in e["message"]
               for e in events), events
    said = err.read_text()
    assert "stopped: maintenance reservation fw starts on its hosts" in said
