"""`airflow-gpu run` at the job's time limit, against a real service on SQLite: what the
command writes after SIGTERM reaches stdout, and the message says how it ended (by itself,
or killed after the grace), not the grace it did not need."""

from __future__ import annotations

import os

import httpx
import pytest
import yaml

from tests.e2e.conftest import create_token, machine_model
from tests.helpers import REPO
from tests.launch.test_run_cli import SMALL, job, job_id_of, run
from tests.launch.test_time_limit import LAST_WORDS, STUBBORN
from tests.service.servers import Server

GRACE = 2        # the policy's stop_grace: SIGTERM to SIGKILL at the limit


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run-limit")
    cluster, policy = tmp / "cluster.yaml", tmp / "policy.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "run", "hosts": [
        {"name": "host-1", "model": str(machine_model(tmp / "this-machine.yaml")),
         "rack": "r1", "switch": "s1"}]}))
    policy.write_text(yaml.safe_dump({"stop_grace": GRACE}))
    db = f"sqlite:///{tmp}/scheduler.db"
    srv = Server(db, cluster, log=tmp / "server.log", interval=0.2,
                 args=("--policy-file", str(policy)))
    admin = httpx.Client(base_url=srv.url, timeout=10, headers={
        "Authorization": f"Bearer {create_token(db, 'ops', '--admin')}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__GPU_SCHEDULER")}
    env.update(AIRFLOW_GPU_URL=srv.url, AIRFLOW_GPU_TOKEN=create_token(db, "ml"),
               AIRFLOW_GPU_LOCAL_HOST="host-1", PYTHONPATH=str(REPO))
    yield {"env": env, "admin": admin, "tmp": tmp}
    admin.close()
    srv.stop()


def test_what_the_command_says_after_sigterm_is_shown_and_how_it_ended(server):
    got = run(server, "--gpus", "1", "--time-limit", "3s", *SMALL, "--", "sh", "-c",
              LAST_WORDS)
    assert got.returncode == 124, got.stderr
    said = got.stdout.splitlines()
    assert said[0] == "started" and said[-2:] == ["saving", "saved"], got.stdout
    ended = got.stderr.splitlines()[-1]
    assert "the job reached its time limit of 3s (time_limit" in ended, got.stderr
    assert "stopped with SIGTERM; main-0 exited by itself after 1." in ended, ended
    assert ended.endswith(" s with code 3") and "SIGKILL" not in ended, ended
    assert job(server, job_id_of(got.stderr))["state"] == "timeout"


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_and_it_says_so(server):
    got = run(server, "--gpus", "1", "--time-limit", "3s", *SMALL, "--", "sh", "-c",
              STUBBORN)
    assert got.returncode == 124, got.stderr
    assert got.stdout.splitlines()[-1] == "ignoring TERM", got.stdout
    assert got.stderr.splitlines()[-1].endswith(
        f"stopped with SIGTERM; main-0 was killed after the {GRACE} s grace"), got.stderr
    assert job(server, job_id_of(got.stderr))["state"] == "timeout"
