"""A job file whose one job its class or the policy refuses (issue 44, point 2): `plan`
plans the others and names the refused job by index and name, as the service names the
job of a batch it refuses; `submit` of that file prints the same lines and sends
nothing. Exit status 2, as for any input to fix."""

from __future__ import annotations

import json

import yaml

from tests.scheduler_core.test_input_errors import cli, one_line_error, write

NOWHERE = {"AIRFLOW_GPU_URL": "http://127.0.0.1:1", "AIRFLOW_GPU_TOKEN": "t"}
JOBS = [{"name": "eval", "roles": [{"name": "w", "gpus": 1}]},
        {"name": "check", "job_class": "validation", "time_limit": "3d",
         "roles": [{"name": "w", "gpus": 1}]},
        {"name": "train", "roles": [{"name": "w", "gpus": 8}]}]
WHY = "time_limit: 3d is more than job class 'validation' allows (1d); ask for at most 1d"


def test_one_job_over_its_class_limit_leaves_the_others_planned(tmp_path):
    jobs = write(tmp_path, "jobs.yaml", yaml.safe_dump({"jobs": JOBS}))
    out = cli("plan", "--jobs", jobs)
    err = one_line_error(out, f"error: {jobs}: jobs[1] (name 'check'): {WHY}\n")
    assert err == f"error: {jobs}: jobs[1] (name 'check'): {WHY}\n"
    assert "eval" in out.stdout and "train" in out.stdout and "check" not in out.stdout
    out = cli("plan", "--jobs", jobs, "--json")
    assert out.returncode == 2 and out.stderr == err
    data = json.loads(out.stdout)
    assert sorted(j["job"] for j in data["admitted"]) == ["eval", "train"]
    assert data["refused"] == [{"job": "check", "index": 1, "error": WHY}]
    # submit refuses the file with the same lines, before it asks the service anything
    sub = cli("submit", jobs, env=NOWHERE)
    assert (sub.returncode, sub.stdout, sub.stderr) == (2, "", err)


def test_jobs_over_the_policy_maximum_are_refused_one_by_one(tmp_path):
    """A time limit above the policy's max_time_limit stopped the plan of the whole file
    with the first such job."""
    policy = write(tmp_path, "policy.yaml", "max_time_limit: 1d\n")
    specs = [JOBS[0], {**JOBS[2], "time_limit": "2d"}, {**JOBS[0], "name": "late",
                                                        "time_limit": "3d"}]
    jobs = write(tmp_path, "jobs.yaml", yaml.safe_dump({"jobs": specs}))
    out = cli("plan", "--jobs", jobs, "--policy-file", policy, "--json")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [
        f"error: {jobs}: jobs[1] (name 'train'): time_limit: 2d is more than the queue "
        "policy allows (1d); ask for at most 1d",
        f"error: {jobs}: jobs[2] (name 'late'): time_limit: 3d is more than the queue "
        "policy allows (1d); ask for at most 1d"]
    data = json.loads(out.stdout)
    assert [j["job"] for j in data["admitted"]] == ["eval"]
    assert [(r["index"], r["job"]) for r in data["refused"]] == [(1, "train"), (2, "late")]


def test_the_service_names_the_job_of_a_batch_it_refuses_in_the_same_words(api, tmp_path):
    """POST /api/v1/jobs/batch of the same jobs: 422, the job named as plan names it."""
    jobs = write(tmp_path, "jobs.yaml", yaml.safe_dump({"jobs": JOBS}))
    line = cli("plan", "--jobs", jobs).stderr.removeprefix(f"error: {jobs}: ").strip()
    r = api.post("/api/v1/jobs/batch", json={"jobs": [{"spec": s} for s in JOBS]},
                 headers={"Authorization": f"Bearer {api.tokens['vision']}"})
    assert r.status_code == 422 and r.json()["detail"] == line, r.text
