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
from tests.helpers import REPO


def cli(*args: str, env: dict | None = None, input: str | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run one command; `env` adds to (or, with None values, removes from) os.environ.
    `timeout` is accepted for the callers' subprocess habits: a command here ends or
    fails the test."""
    out, err = io.StringIO(), io.StringIO()
    environ = {**os.environ, **{k: v for k, v in (env or {}).items() if v is not None}}
    for k, v in (env or {}).items():
        if v is None:
            environ.pop(k, None)
    with mock.patch.dict(os.environ, environ, clear=True), \
            mock.patch.object(sys, "stdin", io.StringIO(input or "")), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            contextlib.chdir(REPO):
        try:
            code = main(list(args))
        except SystemExit as e:           # argparse: --help, usage errors
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["airflow-gpu", *args], code or 0, out.getvalue(),
                                       err.getvalue())
