"""What a bad value is told (issue 44, point 3): one message per field, in the project's
words, naming the field, the value and the fix; the same in a job file (`plan`,
`submit`), an operator's arguments and the API's 422. pydantic's own sentences
("Input should be a valid string"), its regex patterns and a value quoted twice never
reach a user (scheduler_core/fielderrors.py words them)."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.scheduler_core.test_input_errors import cli, one_line_error, write

NOWHERE = {"AIRFLOW_GPU_URL": "http://127.0.0.1:1", "AIRFLOW_GPU_TOKEN": "t"}
NAME_RULE = "use ASCII letters, digits and . _ - (a letter or digit first)"
# (the field, as a path into the spec; the bad value; the whole message)
CASES = [
    ("expected_runtime", "6 hours",
     "'6 hours' is not a duration; write one such as 30s, 90m, 6h, 2d or 1h30m"),
    ("time_limit", -5, "duration -5 is negative; give 0 or more, such as 90m"),
    ("expected_runtime", 0, "0 is too small; give more than 0"),
    ("team", False, "false is a yes/no value, not text (YAML reads an unquoted yes, no, "
     "on, off, true or false so); write the text in quotes, such as team: 'no'"),
    ("team", 7, "7 is a number, not text (YAML reads unquoted digits so, 007 as 7); "
     "write the text in quotes, such as team: '7'"),
    ("name", "bad name!", f"'bad name!' is not a name: it holds a space; {NAME_RULE}"),
    ("user", "x/y", f"'x/y' is not a name: it holds '/'; {NAME_RULE}"),
    ("reservation", "-r", f"'-r' is not a name: it starts with '-'; {NAME_RULE}"),
    ("team", "", f"it is empty; give a name ({NAME_RULE})"),
    ("priority", "high", "'high' is not a whole number; write one such as priority: 1"),
    ("priority", 1.5, "1.5 is not a whole number; write one such as priority: 1"),
    ("priority", 99999999, "99999999 is over the most accepted, 1000000; give 1000000 or "
     "less"),
    ("job_class", ["a"], "a list of 1 item is not text; write job_class: some-text"),
    ("deadline", "2030-12-06", "2030-12-06 is a date without a time; write a full time "
     "with its zone, such as 2030-12-06T00:00:00Z (midnight UTC) or "
     "2030-12-06T00:00:00+01:00"),
    ("deadline", "tomorrow", "'tomorrow' is not a date and time; write one with its time "
     "zone, such as 2026-12-05T06:00:00Z (UTC) or 2026-12-05T07:00:00+01:00"),
    ("placement.locality", "moon", "'moon' is not one of 'host', 'nvlink_domain', "
     "'switch', 'rack' or 'any'; write one of them"),
    ("placement.pack", "maybe", "'maybe' is not true or false; write pack: true or pack: "
     "false"),
    ("placement", 5, "5 is not a mapping of fields; write its fields as key: value lines, "
     "or {key: value, ...}"),
    ("roles", [], "the list is empty; give at least 1 item"),
    ("roles", 5, "5 is not a list; write a list: [a, b], or one '- item' per line"),
    ("roles.0.gpus", -1, "-1 is under the least accepted, 0; give 0 or more"),
    ("roles.0.gpus", None, "null is not a whole number; write one such as gpus: 1"),
    ("roles.0.memory", "lots", "'lots' is not a size; write one such as 8GiB, 48GB or "
     "512MiB"),
    ("roles.0.memory", "-1G", "size '-1G' is negative; give 0 or more, such as 8GiB"),
    ("roles.0.name", "a" * 201, f"'{'a' * 56}... is 201 characters, over the most "
     "accepted, 200; shorten it"),
]
IDS = [f"{c[0]}={str(c[1])[:12]}" for c in CASES]
LEAKS = re.compile(r"Input should|String should|should (have|match)|Field required|"
                   r"valid (string|integer|boolean|list|dictionary)|\^\[|\$'|"
                   r"after validation|Value error")


def spec_with(path: str, value) -> dict:
    spec: dict = {"name": "j", "roles": [{"name": "w", "gpus": 1}]}
    *parents, last = path.split(".")
    at: dict | list = spec
    for key in parents:
        at = at[int(key)] if isinstance(at, list) else at.setdefault(key, {})
    at[int(last) if isinstance(at, list) else last] = value
    return spec


def field_of(path: str) -> str:
    return re.sub(r"\.(\d+)", r"[\1]", path)


@pytest.mark.parametrize("path,value,says", CASES, ids=IDS)
def test_a_job_file_gets_one_message_per_field(tmp_path, path, value, says):
    jobs = write(tmp_path, "jobs.yaml", yaml.safe_dump(spec_with(path, value)))
    plan = cli("plan", "--jobs", jobs)
    err = one_line_error(plan)
    assert err == f"error: {jobs}: jobs[0].{field_of(path)}: {says}\n"
    assert cli("submit", jobs, env=NOWHERE).stderr == err     # checked before it is sent


@pytest.mark.parametrize("path,value,says", CASES, ids=IDS)
def test_the_api_says_the_same(api, path, value, says):
    r = api.post("/api/v1/jobs", json={"spec": spec_with(path, value)},
                 headers={"Authorization": f"Bearer {api.tokens['vision']}"})
    assert r.status_code == 422, r.text
    loc = ["body", "spec", *(int(p) if p.isdigit() else p for p in path.split("."))]
    assert [(d["loc"], d["msg"]) for d in r.json()["detail"]] == [(loc, says)]


def test_an_operator_says_the_same():
    from airflow_gpu.operators.bash import GpuBashOperator

    for kwargs, field, says in [({"gpus": -1}, "roles[0].gpus", CASES[20][2]),
                                ({"expected_runtime": "6 hours"}, "expected_runtime",
                                 CASES[0][2]),
                                ({"team": "bad name!"}, "team", CASES[5][2].replace(
                                    "'bad name!'", "'bad name!'"))]:
        with pytest.raises(ValueError) as exc:
            GpuBashOperator(task_id="t", bash_command="true", **kwargs)
        assert str(exc.value) == f"task 't': the GPU request is invalid: {field}: {says}"


# bad values of every kind, in YAML as users write them: none may leak pydantic's words
SWEEP = [
    "name: [a]", "name: {a: 1}", "name: null", "team: yes", "team: 1.5", "team: 'a b'",
    "user: ''", "user: off", "job_class: 5", "job_class: true", "priority: [1]",
    "priority: {a: 1}", "priority: null", "priority: .inf", "priority: '1e3'",
    "expected_runtime: -1h", "expected_runtime: soon", "expected_runtime: [1]",
    "time_limit: true", "time_limit: 0", "deadline: 5", "deadline: [2030-12-06]",
    "deadline: 2030-12-06T06:00:00", "deadline: 2030-13-45T06:00:00Z", "downstream: -1",
    "downstream: soon", "downstream: .nan", "reservation: 'x y'", "reservation: 5",
    "placement: []", "placement: {locality: 5}", "placement: {affinity: always}",
    "placement: {nics: maybe}", "placement: {cpu_allocation: socket}",
    "placement: {hosts: []}", "placement: {hosts: [5]}", "placement: {hosts: ['']}",
    "roles: {name: w}", "roles: [5]", "roles: [{gpus: 1}]", "roles: [{name: 'w w'}]",
    "roles: [{name: w, gpus: two}]", "roles: [{name: w, gpus: 1.5}]",
    "roles: [{name: w, gpus: 100}]", "roles: [{name: w, cpus: 0}]",
    "roles: [{name: w, replicas: -1}]", "roles: [{name: w, memory: 48}]",
    "roles: [{name: w, memory: true}]", "roles: [{name: w, gpus: 1, gpu: 5}]",
    "roles: [{name: w, gpus: 1, gpu: {model: 5}}]",
    "roles: [{name: w, gpus: 1, gpu: {model: ['']}}]",
    "roles: [{name: w, gpus: 1, gpu: {min_memory: lots}}]",
    "roles: [{name: w, gpu: {mig: {profile: 1g.10gb, count: 0}}}]",
    "array: {range: '0-3', max_running: 0}", "array: {range: x}", "array: [0, 1]",
    "depends_on: 5", "depends_on: [{afterok: 5}]", "depends_on: [{afterok: [5]}]",
    "depends_on: [{kind: later, jobs: [a]}]",
]


@pytest.mark.parametrize("line", SWEEP)
def test_no_bad_value_leaks_the_validators_wording(tmp_path, line):
    key = line.split(":")[0]
    base = {"name": "j", "roles": [{"name": "w", "gpus": 1}]}
    base.pop(key, None)
    jobs = write(tmp_path, "jobs.yaml", yaml.safe_dump(base) + line + "\n")
    err = one_line_error(cli("plan", "--jobs", jobs))
    assert not LEAKS.search(err), err
    text = err.removeprefix(f"error: {jobs}: ").strip()
    fields = re.findall(r"(?:^|; )(jobs\[0\][\w.\[\]]*): ", text)
    assert fields and len(fields) == len(set(fields)), err       # one message per field
    assert not re.search(r"got (.+?)\W* \(got \1\)", text), err   # the value once
