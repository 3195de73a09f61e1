"""`make airflow-standalone` starts Airflow from the project's venv when PATH does not
hold the venv: `airflow standalone` starts its components as `airflow ...` looked up on
PATH, which without the venv's bin fails (FileNotFoundError) and hangs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import httpx

from airflow_gpu.demo.stack import free_port
from tests.helpers import REPO


def healthy(port: int) -> bool:
    """The API server answers and the scheduler, dag-processor and triggerer heartbeat."""
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5).json()
    except (httpx.TransportError, ValueError):
        return False
    return all((health.get(c) or {}).get("status") == "healthy"
               for c in ("scheduler", "dag_processor", "triggerer"))


def test_make_airflow_standalone_runs_without_the_venv_on_path(tmp_path):
    port = free_port()
    make = shutil.which("make")
    assert make, "make is needed (the project's two commands use it)"
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(tmp_path),
           "PYTHONUNBUFFERED": "1", "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
           "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}
    log = tmp_path / "standalone.log"
    with open(log, "w") as out:
        # -o: the venv is there already; never reinstall it from a test
        proc = subprocess.Popen([make, "-s", "-o", ".venv/bin/.installed",
                                 "airflow-standalone"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not healthy(port):
            text = log.read_text(errors="replace")
            assert "FileNotFoundError" not in text, text[-3000:]
            assert proc.poll() is None and time.monotonic() < deadline, text[-3000:]
            time.sleep(1)
        plugins = httpx.get(f"http://127.0.0.1:{port}/api/v2/plugins", timeout=10)
        assert "gpu" in {p["name"] for p in plugins.json()["plugins"]}, plugins.text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
