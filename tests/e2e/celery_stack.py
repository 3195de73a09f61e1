"""A multi-machine Airflow deployment on loopback, for the end-to-end tests: Redis as the
Celery broker, Airflow's metadata database in a temporary PostgreSQL database, the API
server, scheduler, dag-processor and triggerer, and one Celery worker per simulated DGX
host (its own queue and host identity, AIRFLOW_GPU_LOCAL_HOST) plus a general worker on
the default queue. Everything shares one AIRFLOW_HOME, as machines share a DAGs folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from airflow_gpu.demo.stack import free_port
from tests.helpers import PYTHONPATH, REPO, until

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"
ROLES = ("api-server", "scheduler", "dag-processor", "triggerer")


def psql(sql: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc",
                    sql], check=True, capture_output=True, timeout=60)


class CeleryStack:
    def __init__(self, tmp: Path, dag_file: Path, gpu_conn: str,
                 workers: dict[str, tuple[str, str]]):
        """`workers`: Celery hostname -> (queues, AIRFLOW_GPU_LOCAL_HOST)."""
        self.tmp, self.procs = tmp, []
        self.home = tmp / "airflow"
        dags = self.home / "dags"
        dags.mkdir(parents=True)
        shutil.copy(dag_file, dags)
        self.db = f"airflow_e2e_{uuid.uuid4().hex[:10]}"
        psql(f"CREATE DATABASE {self.db}")
        self.redis_port, self.api_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.env = {
            **{k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "AIRFLOW_GPU_"))},
            "AIRFLOW_HOME": str(self.home), "PYTHONPATH": PYTHONPATH,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{PG}/{self.db}",
            # psycopg 3 serves the async engine too (else Airflow wants asyncpg)
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": f"{PG}/{self.db}",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"redis://127.0.0.1:{self.redis_port}/1",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT": gpu_conn,
        }
        try:
            self._start(workers)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, args: list[str], **extra: str) -> None:
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115
        self.procs.append((name, subprocess.Popen(
            args, cwd=REPO, env={**self.env, **extra}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)))

    def _start(self, workers: dict[str, tuple[str, str]]) -> None:
        self._spawn("redis", ["redis-server", "--port", str(self.redis_port), "--bind",
                              "127.0.0.1", "--save", "", "--appendonly", "no"])
        done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"],
                              env=self.env, cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"airflow db migrate failed:\n{done.stderr[-3000:]}"
        airflow = [sys.executable, "-m", "airflow"]
        for role in ROLES:
            extra = ["--skip-serve-logs"] if role == "triggerer" else []
            self._spawn(role, [*airflow, role, *extra])
        for name, (queues, identity) in workers.items():
            self._spawn(f"worker-{name}", [
                *airflow, "celery", "worker", "--queues", queues, "--celery-hostname",
                f"{name}@loopback", "--pid", str(self.tmp / f"worker-{name}.pid"),
                "--skip-serve-logs", "--without-mingle", "--without-gossip"],
                AIRFLOW_GPU_LOCAL_HOST=identity)
        self.http = httpx.Client(base_url=self.url, timeout=10)
        self.wait_for(self._api_up, 120, "the API server")

    def _api_up(self) -> bool:
        self._check_alive()
        try:
            return self.http.get("/api/v2/version").status_code == 200
        except httpx.TransportError:
            return False

    def _check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n"
                                     + self.log(name)[-3000:])

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait_for(self, predicate, timeout: float, what: str):
        return until(predicate, what, timeout, every=0.5)

    def trigger(self, dag_id: str, timeout: float = 90) -> str:
        def parsed():
            self._check_alive()
            return self.http.get(f"/api/v2/dags/{dag_id}").status_code == 200
        self.wait_for(parsed, timeout, f"the dag-processor to parse {dag_id}")
        run = self.http.post(f"/api/v2/dags/{dag_id}/dagRuns",
                             json={"logical_date": None}).raise_for_status().json()
        return run["dag_run_id"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 120) -> dict[str, str]:
        """The run's end: {task_id: state}."""
        def done():
            self._check_alive()
            run = self.http.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()
            return run["state"] in ("success", "failed")
        self.wait_for(done, timeout, f"the run of {dag_id}")
        tis = self.http.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
        return {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The task's log as its worker wrote it (JSON lines: the events and the
        exceptions' messages)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / \
            f"task_id={task_id}"
        lines = []
        for path in sorted(folder.glob("attempt=*.log")):
            for raw in path.read_text(errors="replace").splitlines():
                try:
                    record = json.loads(raw)
                except ValueError:
                    lines.append(raw)
                    continue
                lines.append(str(record.get("event", "")))
                lines += [str(e.get("exc_value")) for e in record.get("error_detail") or ()]
        return "\n".join(lines)

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        deadline = time.monotonic() + 5      # what is left then is killed: nothing to keep
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        psql(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
