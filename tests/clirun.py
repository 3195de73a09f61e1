"""`airflow-gpu ...` as the tests run it: `main(argv)` in this process, with the
environment, stdin, stdout and stderr a command of its own would have, and its exit status
as `python -m airflow_gpu.cli` turns it into one (an escaped exception: status 1 and its
traceback on stderr). A fresh interpreter costs ~1 s of CPU per command, hundreds of times
a run; the tests of the entry point itself (tests/cli/test_cli.py, pipes, signals) and the
docs' commands run the real process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from unittest import mock

from airflow_gpu.cli.main import main
from tests.forks import exit_status
from tests.helpers import REPO


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one command with os.environ and `env`, an empty stdin, in the repository (a
    command that returns None exits 0, as `sys.exit(main())` does)."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), \
            mock.patch.object(sys, "stdin", io.StringIO("")), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            contextlib.chdir(REPO):
        try:
            code = main(list(args))
        except SystemExit as e:           # argparse: --help, usage errors
            code = exit_status(e)
        except Exception:
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["airflow-gpu", *args], code or 0, out.getvalue(),
                                       err.getvalue())
