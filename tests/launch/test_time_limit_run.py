"""`airflow-gpu run` at the job's time limit, against a real service on SQLite: what the
command writes after SIGTERM reaches stdout, and the message says how it ended (by itself,
or killed after the grace), not the grace it did not need."""

from __future__ import annotations

import re

import pytest

from tests.launch.runserver import serve
from tests.launch.test_run_cli import SMALL, job, job_id_of, run
from tests.launch.test_time_limit import LAST_WORDS, STUBBORN

GRACE = 2        # the policy's stop_grace: SIGTERM to SIGKILL at the limit


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("run-limit"), stop_grace=GRACE) as server:
        yield server


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


def test_scenario_a_gang_at_its_time_limit_keeps_each_replicas_output(server):
    """Time limit x output: two replicas on this host, the first saves a checkpoint and
    exits, the second ignores SIGTERM; both write through the grace, labelled."""
    script = (f'if [ "$AIRFLOW_GPU_REPLICA" = 0 ]; then {LAST_WORDS}; '
              f"else {STUBBORN}; fi")
    got = run(server, "--gpus", "1", "--replicas", "2", "--time-limit", "3s", *SMALL,
              "--", "sh", "-c", script)
    assert got.returncode == 124, got.stderr
    said = got.stdout.splitlines()
    assert {"[main-0] saving", "[main-0] saved", "[main-1] ignoring TERM"} <= set(said), said
    assert said.index("[main-0] saving") < said.index("[main-0] saved")
    ended = got.stderr.splitlines()[-1]
    assert re.search(r"stopped with SIGTERM; main-\d.+; main-\d.+$", ended), ended
    assert re.search(r"main-0 exited by itself after 1\.\d s with code 3", ended), ended
    assert f"main-1 was killed after the {GRACE} s grace" in ended, ended
    assert job(server, job_id_of(got.stderr))["state"] == "timeout"
    cluster = server["admin"].get("/api/v1/cluster").json()
    assert cluster["gpus_allocated"] == 0
