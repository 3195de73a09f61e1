"""A job file copied from the docs (issue 44, point 1): every value goes through the one
parser `plan`, `submit`, `run` and the operators share (scheduler_core/jobfile.py), so
what `plan` takes is sent as the service stores it, and what it refuses, each refuses in
the same words. Through the CLI's entry point, against `airflow-gpu server` in its own
process on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.cli.test_cli_e2e import cli, server  # noqa: F401 (fixture)
from tests.scheduler_core.test_input_errors import one_line_error, write

NOWHERE = {"AIRFLOW_GPU_URL": "http://127.0.0.1:1", "AIRFLOW_GPU_TOKEN": "t"}


def team_env(server) -> dict:  # noqa: F811
    token = cli("token", "create", "--team", "vision", "--db", server["db"]).stdout.strip()
    return {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": token,
            "AIRFLOW_GPU_LOCAL_HOST": "*"}


def test_an_unquoted_deadline_as_the_user_guide_writes_it(server, tmp_path):  # noqa: F811
    """YAML read `deadline: ...Z` as a datetime: plan took it, submit and run died in
    json.dumps with a 43-line traceback."""
    due = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    job = write(tmp_path, "nightly.yaml", f"name: nightly\nexpected_runtime: 10m\n"
                f"deadline: {due}\ndownstream: 2h\nroles:\n  - {{name: w, gpus: 1}}\n")
    env = team_env(server)
    assert cli("plan", "--jobs", job).returncode == 0
    out = cli("submit", job, "--json", env=env)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    sent = json.loads(out.stdout)
    assert sent["spec"]["deadline"] == due and sent["spec"]["downstream"] == "2h"
    assert cli("cancel", sent["id"], env=env).returncode == 0
    out = cli("run", job, "--", "sh", "-c", "echo ran", env=env)
    assert out.returncode == 0 and "ran" in out.stdout + out.stderr, out.stderr


def test_a_date_alone_says_what_to_write_in_plan_submit_and_run(tmp_path):
    job = write(tmp_path, "nightly.yaml", "name: nightly\ndeadline: 2030-12-06\n"
                "roles:\n  - {name: w, gpus: 1}\n")
    says = (f"{job}: jobs[0].deadline: 2030-12-06 is a date without a time; write a full "
            "time with its zone, such as 2030-12-06T00:00:00Z (midnight UTC) or "
            "2030-12-06T00:00:00+01:00\n")
    plan = cli("plan", "--jobs", job)
    assert one_line_error(plan).endswith(says) and "datetime" not in plan.stderr
    # nothing is sent: the unreachable URL is never asked
    assert cli("submit", job, env=NOWHERE).stderr == plan.stderr
    assert cli("run", job, "--", "true", env=NOWHERE).stderr == plan.stderr


@pytest.mark.parametrize("line", ["name: 2026-12-06", "team: 2026-01-01"])
def test_text_that_yaml_would_read_as_a_date_is_text(tmp_path, line):
    """Such a value was refused by plan as `Input should be a valid string` and crashed
    submit; it is the text written, as in JSON and YAML 1.2."""
    spec = "name: j\nroles:\n  - {name: w, gpus: 1}\n"
    spec = spec.replace("name: j", line) if line.startswith("name") else f"{line}\n{spec}"
    out = cli("plan", "--jobs", write(tmp_path, "job.yaml", spec), "--json")
    assert out.returncode == 0, out.stderr
    field, value = line.split(": ")
    assert json.loads(out.stdout)["admitted"][0]["job" if field == "name" else field] == value


def test_the_operators_check_and_send_a_spec_as_job_files_do(tmp_path):
    """The operators' arguments go through the same parser: the spec they send is the
    one a job file with the same fields sends, and a bad value has plan's message."""
    from airflow_gpu.operators.bash import GpuBashOperator
    from airflow_gpu.scheduler_core.jobfile import read_jobs, wire

    op = GpuBashOperator(task_id="t", bash_command="true", gpus=1, gpu_model="A100",
                         memory="48GB", time_limit=5400, placement={"hosts": "dgx-[1-2]"})
    job = write(tmp_path, "job.yaml", "name: d.t\npriority: 0\ntime_limit: 5400\n"
                "placement: {hosts: 'dgx-[1-2]'}\nroles:\n  - {name: main, gpus: 1, "
                "cpus: 1, memory: 48GB, gpu: {model: A100}}\n")
    assert op._spec("d.t") == wire(read_jobs(job)[0])
    assert json.loads(json.dumps(op._spec("d.t")))["time_limit"] == "1h30m"
    bad = write(tmp_path, "bad.yaml", "name: j\nexpected_runtime: 6 hours\n"
                "roles:\n  - {name: w}\n")
    said = one_line_error(cli("plan", "--jobs", bad)).split("jobs[0].", 1)[1].strip()
    with pytest.raises(ValueError) as exc:
        GpuBashOperator(task_id="t", bash_command="true", expected_runtime="6 hours")
    assert str(exc.value) == f"task 't': the GPU request is invalid: {said}"
