"""Values in job, cluster and policy files that used to be taken without a word: each is
one line on stderr naming the file and the field, exit 2, through the real CLI."""

from __future__ import annotations

import pytest

from tests.scheduler_core.test_input_errors import CLUSTER, JOB, cli, one_line_error, write


def test_an_expected_runtime_of_zero(tmp_path):
    jobs = write(tmp_path, "jobs.yaml", JOB.replace("roles:", "expected_runtime: 0\nroles:"))
    one_line_error(cli("plan", "--jobs", jobs), f"{jobs}: jobs[0].expected_runtime: 0 is "
                   "too small; give more than 0")
    # submit checks the file before it asks the service anything
    one_line_error(cli("submit", jobs, "--url", "http://127.0.0.1:1", "--token", "t"),
                   f"{jobs}: jobs[0].expected_runtime: ")


@pytest.mark.parametrize("name,says", [
    ("dgx a-01", "'dgx a-01' is not a host name: it holds a space"),
    ("dgx-\u00e9[1-2]", "'dgx-\u00e91' is not a host name: it holds '\u00e9' (U+00E9)"),
    ("dgx-\u0430-01", "it holds '\u0430' (U+0430)"),           # a Cyrillic a
    ("-dgx-01", "it starts with '-'"),
    ("dgx/01", "it holds '/'"),
], ids=["space", "latin-1", "cyrillic", "leading-dash", "slash"])
def test_host_names_an_agent_could_not_register(tmp_path, name, says):
    cluster = write(tmp_path, "cluster.yaml", f"hosts:\n  - {{name: '{name}', model: dgx-a100}}\n")
    jobs = write(tmp_path, "jobs.yaml", JOB)
    one_line_error(cli("plan", "--cluster", cluster, "--jobs", jobs),
                   f"{cluster}: hosts[0].name: ", says, "ASCII letters, digits and . _ -")


def test_usual_host_names_and_ranges_are_taken(tmp_path):
    cluster = write(tmp_path, "cluster.yaml", CLUSTER.replace(
        "dgx-[1-2]", "node_7.rack-a.example.com"))
    out = cli("plan", "--cluster", cluster, "--jobs", write(tmp_path, "jobs.yaml", JOB))
    assert out.returncode == 0, out.stderr
    assert "node_7.rack-a.example.com" in out.stdout


@pytest.mark.parametrize("policy,field,value", [
    ("age_weight: .inf\n", "age_weight", "inf"),
    ("size_weight: .nan\n", "size_weight", "nan"),
    ("teams:\n  ml: {share: .inf}\n", "teams.ml.share", "inf"),
    ("locality_slowdown: [1.0, 1.1, .inf]\n", "locality_slowdown[2]", "inf"),
    ("preemption:\n  rules: [{min_band: .inf, preempts_below: 10}]\n",
     "preemption.rules[0].min_band", "inf"),
], ids=["age_weight", "size_weight", "share", "locality_slowdown", "min_band"])
def test_inf_and_nan_in_a_policy_file(tmp_path, policy, field, value):
    path = write(tmp_path, "policy.yaml", policy)
    jobs = write(tmp_path, "jobs.yaml", JOB)
    one_line_error(cli("plan", "--jobs", jobs, "--policy-file", path),
                   f"{path}: {field}: .{value} is not a finite number; give a finite "
                   "one")


def test_a_default_time_limit_over_the_maximum_names_the_policy_file(tmp_path):
    """It used to be reported against the first job that set no limit, telling its
    author to ask for less although the job asked for nothing."""
    path = write(tmp_path, "policy.yaml", "default_time_limit: 2h\nmax_time_limit: 1h\n")
    jobs = write(tmp_path, "jobs.yaml", JOB)
    err = one_line_error(cli("plan", "--jobs", jobs, "--policy-file", path),
                         f"{path}: ", "default_time_limit: 2h is more than max_time_limit "
                         "1h", "lower default_time_limit or raise max_time_limit")
    assert "job 'j'" not in err and jobs not in err
    # the service reads the same file at start, and refuses it the same way
    one_line_error(cli("simulate", "--hosts", "1", "--trace", jobs, "--policy-file", path),
                   f"{path}: ", "default_time_limit: 2h is more than max_time_limit")


def test_a_class_default_above_the_policy_maximum_is_capped_not_blamed_on_the_job(tmp_path):
    """The built-in validation class defaults to 2h; under a policy maximum of 1h a job of
    that class that asks for nothing used to be refused as if it had asked for 2h."""
    from airflow_gpu.scheduler_core.policy.config import PolicyConfig
    from tests.databases import serve

    policy = write(tmp_path, "policy.yaml", "max_time_limit: 1h\n")
    jobs = write(tmp_path, "jobs.yaml", JOB.replace("roles:", "job_class: validation\nroles:"))
    out = cli("plan", "--jobs", jobs, "--policy-file", policy)
    assert out.returncode == 0, out.stderr
    stack = serve(f"sqlite:///{tmp_path / 's.db'}", PolicyConfig(max_time_limit=3600))
    api = next(stack)
    try:
        who = {"Authorization": f"Bearer {api.tokens['vision']}"}
        spec = {"name": "v", "job_class": "validation", "roles": [{"name": "w", "gpus": 1}]}
        r = api.post("/api/v1/jobs", json={"spec": spec}, headers=who)
        assert r.status_code == 201, r.text
        assert api.tick() == [r.json()["id"]]
        admitted = api.get(f"/api/v1/jobs/{r.json()['id']}", headers=who).json()
        assert admitted["time_limit_s"] == 3600, admitted
        r = api.post("/api/v1/jobs", json={"spec": {**spec, "time_limit": "2h"}}, headers=who)
        assert r.status_code == 422 and "2h is more than the queue policy allows (1h)" in r.text
    finally:
        stack.close()
