"""`airflow-gpu server` in a process of its own on a free loopback port, for the tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx

from airflow_gpu.demo_stack import free_port
from tests.helpers import REPO


class Server:
    def __init__(self, db_url: str, cluster_file, lease_ttl: float = 60, log=None,
                 interval: float = 0.1, args: tuple[str, ...] = ()):
        self.db, self.port, self.log = db_url, free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_gpu.cli", "server", "--db", db_url, "--create",
             "--cluster", str(cluster_file), "--port", str(self.port),
             "--interval", str(interval), "--lease-ttl", str(lease_ttl),
             "--log-level", "warning", *args],
            cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=open(log, "w") if log else subprocess.DEVNULL)  # noqa: SIM115
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
