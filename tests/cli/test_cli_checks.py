"""Mistakes the CLI can see in its own arguments exit 2 with one line before any request:
the URL points at a closed port, so an error that came from asking would say "cannot
reach the scheduler" instead of naming the argument."""

from __future__ import annotations

import typing

import pytest

from airflow_gpu import __version__
from airflow_gpu.cli.commands.slurm_command import STATES
from tests.scheduler_core.test_input_errors import cli, one_line_error

NOWHERE = ("--url", "http://127.0.0.1:1", "--token", "t")


@pytest.mark.parametrize("args,says", [
    (("update", "train"), ["update train: nothing to change", "--priority",
                           "--time-limit"]),
    (("queue", "--state", "bogus"), ["--state: 'bogus' is no job state", "pending",
                                     "timeout"]),
    (("acct", "--since", "2999-01-01"), ["--since: '2999-01-01' is in the future",
                                         "a time ago such as 7d"]),
    (("token", "create", "--team", "ml", "--expires", "2020-01-01"),
     ["--expires: '2020-01-01' is in the past", "a duration such as 30d"]),
], ids=["update-without-change", "queue-bad-state", "acct-since-future",
        "token-expired"])
def test_a_mistake_in_the_arguments_fails_before_any_request(args, says):
    err = one_line_error(cli(*args, *NOWHERE), *says)
    assert "cannot reach" not in err


def test_token_create_on_the_database_refuses_a_past_expiry_too(tmp_path):
    one_line_error(cli("token", "create", "--team", "ml", "--expires", "2020-01-01T00:00",
                       "--db", f"sqlite:///{tmp_path}/s.db"), "is in the past")
    assert not (tmp_path / "s.db").exists() or (tmp_path / "s.db").stat().st_size == 0


def test_the_cli_knows_the_api_job_states():
    from airflow_gpu.scheduler_core.api.models.base import States

    assert typing.get_args(States) == STATES


def test_version():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout == f"airflow-gpu {__version__}\n", out
