"""The `airflow-gpu` command: parse, run the command, and turn its errors into one line
and an exit status."""

from __future__ import annotations

import os
import sys

from ..scheduler_core.errors import InputError
from .cli_config import build_parser

EXIT_INPUT = 2
EXIT_API = 1
EXIT_PIPE = 141     # stdout closed early (a pipe's reader exited), as SIGPIPE leaves Unix tools

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    from ..scheduler_core.client import ApiError

    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()        # a closed pipe shows here, not as Python exits
        return status
    except BrokenPipeError:
        # The reader went away (`airflow-gpu topo --yaml | head -1`): stop quietly, as Unix
        # tools do when SIGPIPE ends them (exit status 128 + 13), with no message. Further
        # writes, Python's own flush at exit included, go to /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except ApiError as exc:
        print(f"error: the scheduler answered {exc}", file=sys.stderr)
        # a 422 is bad input the service caught (a field, a value): as bad input caught here
        return EXIT_INPUT if exc.status == 422 else EXIT_API
