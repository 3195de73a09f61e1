"""What the command groups share: the console tables print on, the database flag, and
for the client commands the connection flags (--url, --token, --conn-id), the API client
they make and the way they print its answer (a table, or JSON with --json), and how a
job file's refused jobs are told."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

DEFAULT_DB = "sqlite:///airflow-gpu.db"


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich exits with status 1 on a closed pipe; main() ends quietly with EXIT_PIPE."""
        self.quiet = True
        raise BrokenPipeError


def console() -> Console:
    out = _Console()
    if not out.is_terminal:  # pipes and CI logs: wide enough that hosts and cpus fit
        out.width = max(out.width, 160)
    return out


def refuse_jobs(path: str, refused: list[tuple[int, str, str]]) -> int:
    """Jobs of a file refused one by one, as (index, name, why): a line each on stderr,
    in the words of the service's batch refusals (plan and submit print the same)."""
    from ..scheduler_core.jobfile import file_index

    sys.stdout.flush()                 # what was planned, before the refusals
    for i, name, why in refused:
        print(f"error: {path}: {file_index(i, name)}: {why}", file=sys.stderr)
    return 2 if refused else 0


def db_arg(p: argparse.ArgumentParser, create: bool = False) -> None:
    p.add_argument("--db", default=DEFAULT_DB,
                   help=f"SQLAlchemy URL (default {DEFAULT_DB}; or postgresql+psycopg://...)")
    if create:
        p.add_argument("--create", action="store_true",
                       help="SQLite: create the database file when it does not exist (else "
                       "refused, so a mistyped path does not start an empty database; "
                       "`airflow-gpu db upgrade --db URL` creates it too)")


def service_args(p: argparse.ArgumentParser) -> None:
    """--url, --token, --conn-id: where the client commands find the service (api_client)."""
    p.add_argument("--url", help="the service (default $AIRFLOW_GPU_URL or "
                   "http://127.0.0.1:8080)")
    p.add_argument("--token", help="bearer token (default $AIRFLOW_GPU_TOKEN)")
    p.add_argument("--conn-id", default="gpu_scheduler_default",
                   help="inside Airflow, without --url/--token or the variables: the "
                   "gpu_scheduler connection to read them from")


def client_parent() -> argparse.ArgumentParser:
    """The client commands' parent parser: the connection flags and --json."""
    client = argparse.ArgumentParser(add_help=False)
    service_args(client)
    client.add_argument("--json", action="store_true", help="print JSON")
    return client


def api_client(args: argparse.Namespace):
    """The service and token from flags, else AIRFLOW_GPU_URL / AIRFLOW_GPU_TOKEN, else
    (inside Airflow) the `gpu_scheduler` connection named by --conn-id."""
    import os

    from ..scheduler_core.client import Client

    url = args.url or os.environ.get("AIRFLOW_GPU_URL")
    token = args.token or os.environ.get("AIRFLOW_GPU_TOKEN")
    if not (url and token):
        options = _airflow_connection(args.conn_id)
        if options:
            url, token = url or options["url"], token or options["token"]
            return Client(url, token, options["timeout"], options["verify"])
    return Client(url, token)


def _airflow_connection(conn_id: str) -> dict | None:
    """The connection's client options, where Airflow is installed and defines it."""
    try:
        from ..hooks.scheduler import GpuSchedulerHook, client_options
    except ImportError:                     # no Airflow here: flags and environment only
        return None
    try:
        return client_options(GpuSchedulerHook.get_connection(conn_id))
    except Exception:   # undefined connection, no metadata DB: fall back to the defaults
        return None


def output(args: argparse.Namespace, data: Any, table) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        console().print(table(data))


def show(call, table):
    """A client command: call the API, print the answer as a table (or JSON)."""
    def run(args: argparse.Namespace) -> int:
        with api_client(args) as c:
            output(args, call(c, args), table)
        return 0
    return run
