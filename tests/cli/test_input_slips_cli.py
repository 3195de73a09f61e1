"""Slips the CLI used to pass on silently (issue 44, point 8): an empty `run -w`, `-x` or
`--gpu-model`, repeated `--array` indexes, a job file's repeated webhook events, and
`reserve create --gpu-model` without `--gpus`. Each exits 2 with one line naming the flag
or field, the value and the fix, before any request (the URL is a closed port, so an
error that came from asking would say "cannot reach the scheduler")."""

from __future__ import annotations

import pytest
import yaml

from tests.scheduler_core.test_input_errors import cli, one_line_error, write

NOWHERE = ("--url", "http://127.0.0.1:1", "--token", "t")
JOB = {"name": "eval", "roles": [{"name": "w", "gpus": 1}]}


@pytest.mark.parametrize("args,says", [
    (("run", "-w", "", "--", "true"),
     ["--nodelist: '' names no host", "leave --nodelist out (any host)"]),
    (("run", "-x", " , ", "--", "true"),
     ["--exclude: ' , ' names no host", "dgx-a-[01-04]"]),
    (("run", "-w", "dgx-a-[01-9999999]", "--", "true"),
     ["--nodelist: host range 'dgx-a-[01-9999999]' names 9,999,999 hosts"]),
    (("run", "--gpus", "1", "--gpu-model", "", "--", "true"),
     ["--gpu-model: '' names no GPU model", "A100,H100", "leave --gpu-model out"]),
    (("reserve", "create", "x", "--hosts", "dgx-1", "--gpu-model", "", "--duration", "1h",
      "--maint"), ["--gpu-model: '' chooses among the hosts of --gpus N"]),
], ids=["run-empty-nodelist", "run-empty-exclude", "run-huge-range", "run-empty-gpu-model",
        "reserve-gpu-model-without-gpus"])
def test_an_empty_or_huge_flag_is_refused_before_any_request(args, says):
    err = one_line_error(cli(*args, *NOWHERE), *says)
    assert "cannot reach" not in err


def test_repeated_array_indexes_and_events_are_refused_by_plan_and_submit(tmp_path):
    one = write(tmp_path, "one.yaml", yaml.safe_dump(JOB))
    one_line_error(cli("submit", one, "--array", "0,0,0", *NOWHERE),
                   "--array '0,0,0': array.range: index 0 is given more than once",
                   "give each index once, e.g. 0")
    arr = write(tmp_path, "arr.yaml", yaml.safe_dump({**JOB, "array": "1-7:2,3"}))
    for out in (cli("plan", "--jobs", arr), cli("submit", arr, *NOWHERE)):
        one_line_error(out, "array.range: index 3 is given more than once in '1-7:2,3'",
                       "e.g. 1-7:2")
    events = write(tmp_path, "ev.yaml", yaml.safe_dump({**JOB, "notify": {
        "url": "http://127.0.0.1:9/hook", "events": ["start", "start"]}}))
    for out in (cli("plan", "--jobs", events), cli("submit", events, *NOWHERE)):
        one_line_error(out, "notify.events: 'start' is given twice",
                       "give each event once: start")
