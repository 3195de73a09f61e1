"""The processes `airflow-gpu demo` runs, and their clean end.

The scheduler-core (SQLite, the built-in demo cluster, a policy file) and real Airflow
3 components on a throw-away AIRFLOW_HOME with its embedded SQLite database: the API
server (tasks reach the metadata database only through its Execution API, so LocalExecutor
needs it; it also serves the UI and the plugin's /gpu pages), the scheduler with
LocalExecutor, the triggerer (where deferred GPU tasks wait) and the dag-processor.
Each runs in a session of its own, so stopping it stops its workers and task processes
too, on success, on failure and on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

AIRFLOW = ("api-server", "scheduler", "triggerer", "dag-processor")
STOP_WAIT = 5.0          # seconds a process gets after SIGTERM before SIGKILL


def free_port() -> int:
    """A free loopback port (the demo's and the tests' servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StackError(RuntimeError):
    """A part of the demo stack did not start; the message says which and where its log is."""


class Stack:
    def __init__(self, work: Path, cluster: str, policy: dict, dags: Path, teams: list[str],
                 parallelism: int, extra_env: dict[str, str] | None = None):
        self.work, self.cluster, self.dags = work, cluster, dags
        self.teams, self.parallelism = teams, parallelism
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.policy_file = work / "policy.json"
        self.policy_file.write_text(json.dumps(policy))
        self.db = f"sqlite:///{work}/scheduler.db"
        self.core_port, self.api_port = free_port(), free_port()
        self.core_url = f"http://127.0.0.1:{self.core_port}"
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.tokens: dict[str, str] = {}
        self.extra_env = extra_env or {}

    # -- start ----------------------------------------------------------------------------
    def start(self, say) -> None:
        self._spawn("scheduler-core", [
            sys.executable, "-m", "airflow_gpu.cli", "server", "--db", self.db, "--create",
            "--cluster", self.cluster, "--port", str(self.core_port), "--interval", "0.5",
            "--policy-file", str(self.policy_file), "--log-level", "warning"])
        say(f"scheduler-core on {self.core_url} (cluster {self.cluster!r}, SQLite)")
        env = None
        migrate = None
        try:
            self._wait("scheduler-core", f"{self.core_url}/healthz", 60)
            self._make_tokens()
            env = self.airflow_env()
            say(f"Airflow home {env['AIRFLOW_HOME']}: migrating its SQLite database")
            migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"],
                                     env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise StackError("`airflow db migrate` did not finish within 300 s") from None
        if migrate.returncode != 0:
            (self.logs / "db-migrate.log").write_text(migrate.stdout + migrate.stderr)
            raise StackError("`airflow db migrate` failed:\n" + migrate.stderr[-2000:])
        for part in AIRFLOW:
            args = ["--host", "127.0.0.1", "--port", str(self.api_port), "--workers", "1"] \
                if part == "api-server" else []
            self._spawn(part, [sys.executable, "-m", "airflow", part, *args], env)
        say(f"Airflow {', '.join(AIRFLOW)} starting (LocalExecutor, parallelism "
            f"{self.parallelism}; logs in {self.logs})")
        self._wait("api-server", f"{self.url}/api/v2/version", 180)
        self._wait_healthy(120)

    def airflow_env(self) -> dict[str, str]:
        home = self.work / "airflow"
        # nothing of the caller's Airflow setup (a real AIRFLOW_HOME, connections) leaks in
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        conn = {"conn_type": "gpu_scheduler", "host": "127.0.0.1", "port": self.core_port}
        env.update({
            "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            # every simulated host is this machine: the local runner starts them all
            "AIRFLOW__GPU_SCHEDULER__LOCAL_HOST": "*",
            "AIRFLOW__GPU_SCHEDULER__UI_REFRESH_SECONDS": "1",
            # the UI reads the whole queue (an admin token); each team's DAGs submit
            # with the team's own token
            "AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT": json.dumps(
                {**conn, "password": self.tokens["admin"]}),
            **{f"AIRFLOW_CONN_GPU_SCHEDULER_{t.upper()}": json.dumps(
                {**conn, "password": self.tokens[t]}) for t in self.teams},
            **self.extra_env})
        return env

    def _make_tokens(self) -> None:
        from ..scheduler_core.service.auth import create_token
        from ..scheduler_core.store.db import make_engine, sessions

        engine = make_engine(self.db)
        try:
            made = sessions(engine)
            self.tokens = {t: create_token(made, t) for t in self.teams}
            self.tokens["admin"] = create_token(made, "demo", admin=True)
        finally:
            engine.dispose()

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> None:
        with open(self.logs / f"{name}.log", "w") as log:
            self.procs[name] = subprocess.Popen(
                argv, env=env, cwd=self.work, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise StackError(f"{name} exited with code {p.returncode}; the end of its "
                                 f"log ({self.logs / name}.log):\n{self.tail(name)}")

    def _wait(self, name: str, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise StackError(f"{name} did not answer {url} within {timeout:.0f} s; the "
                                 f"end of its log:\n{self.tail(name)}")
            time.sleep(0.3)

    def _wait_healthy(self, timeout: float) -> None:
        """The scheduler, the triggerer and the dag-processor have heartbeaten."""
        deadline = time.monotonic() + timeout
        parts = ("scheduler", "triggerer", "dag_processor")
        health: dict = {}
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                health = httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                health = {}
            if all((health.get(p) or {}).get("status") == "healthy" for p in parts):
                return
            time.sleep(0.5)
        raise StackError(f"Airflow's components did not report healthy within {timeout:.0f} "
                         f"s: {json.dumps(health)}; logs in {self.logs}")

    def tail(self, name: str, lines: int = 25) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])

    # -- stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM to each process group (the Airflow parts first, so no task is started
        after the scheduler-core is gone), SIGKILL to what is left after STOP_WAIT."""
        order = [n for n in self.procs if n != "scheduler-core"] + ["scheduler-core"]
        for name in order:
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        for name in order:
            p = self.procs.get(name)
            if p is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            _signal(p, signal.SIGKILL)    # the group: workers and replicas left behind
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        self._reap_strays()

    def _reap_strays(self) -> None:
        """Replicas run in sessions of their own (the local runner's process groups), so a
        task killed mid-run may leave them behind: end those whose AIRFLOW_HOME is this
        demo's (nothing else has it)."""
        mark = f"AIRFLOW_HOME={self.work / 'airflow'}".encode() + b"\0"
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                if int(proc.name) != os.getpid() and mark in (proc / "environ").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)


def _signal(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)        # start_new_session: the group id is its pid
