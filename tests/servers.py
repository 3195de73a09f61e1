"""`airflow-gpu server` in a process of its own on a free loopback port, for the tests."""

from __future__ import annotations

import collections
import os
import signal
import time

import httpx
import yaml

from airflow_gpu.demo.stack import free_port
from tests.forks import cli_forks
from tests.helpers import REPO


class Server:
    def __init__(self, db_url: str, cluster_file, lease_ttl: float = 60, log=None,
                 interval: float = 0.25, args: tuple[str, ...] = ()):
        self.db, self.port, self.log = db_url, free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        out = os.open(os.devnull, os.O_WRONLY)
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if log else out
        try:       # forked from a process that has imported the CLI (tests/forks.py)
            self.proc = cli_forks(str(REPO)).cli(
                ["server", "--db", db_url, "--create", "--cluster", str(cluster_file),
                 "--port", str(self.port), "--interval", str(interval),
                 "--lease-ttl", str(lease_ttl), "--log-level", "warning", *args], out, err)
        finally:
            os.close(out)
            if err != out:
                os.close(err)
        deadline = time.monotonic() + 30
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("server did not start: "
                                     + (log.read_text() if log else "(no log kept)"))
            time.sleep(0.1)

    def healthy(self) -> dict | None:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).json()
        except (httpx.TransportError, ValueError):
            return None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def prepared(db_url: str, tmp_path, cluster: dict, team: str):
    """The database at `db_url` with its tables, a token of `team`, and `cluster` written
    to a file: what a server of the tests starts from. Returns (engine, token, file)."""
    from airflow_gpu.scheduler_core.service.auth import create_token
    from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    engine = make_engine(db_url)
    upgrade(engine)
    return engine, create_token(sessions(engine), team), path


def no_failed_requests(results: list, at_least: int) -> None:
    """A load's (what, status) results: more than `at_least`, none of them failed."""
    failed = [r for r in results if r[1] not in (200, 201)]
    assert len(results) > at_least and not failed, (
        f"{len(failed)} of {len(results)} requests failed: "
        f"{collections.Counter(r[1] for r in failed)}, e.g. {failed[:2]}")
