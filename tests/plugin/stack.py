"""The real stack the UI tests and `scripts/screenshots.py` run against: a scheduler-core
holding running, admitted, pending, preempting, borrowed, unhealthy and drained parts
(teams with guarantees and a borrowing limit), and an Airflow API
server (SimpleAuthManager, no examples, a temporary AIRFLOW_HOME) with the plugin, both
on free loopback ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

import airflow_gpu.scheduler_core.engine
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, sessions
from tests.helpers import PYTHONPATH
from tests.servers import Server, free_port

HOST_MODELS = Path(airflow_gpu.scheduler_core.engine.__file__).parent / "hostmodels"
USERS = {"admin": "admin-pass", "viewer": "viewer-pass"}
TRAIN_KEY = "vision_pipeline/train/manual__2025-06-01T00:00:00+00:00/-1/1"
UNHEALTHY = ("dgx-a-02", 5, "XID 79: GPU has fallen off the bus")
DRAINED = "dgx-v-02"
UNREACHABLE = "dgx-h-02"       # its node agent registers, then falls silent
HOST_TIMEOUT = 2               # seconds of silence before a registered host is unreachable
# GPU utilization (percent) as node agents would report it for the busy hosts
UTILIZATION = {"dgx-a-01": [97, 95, 96, 94, 97, 93, 95, 96],
               "dgx-h-01": [71, 64, 68, 70, 66, 73, 69, 65]}

CLUSTER = {"cluster": "demo", "hosts": [
    {"name": "dgx-a-[01-02]", "model": "dgx-a100", "rack": "rack-1", "switch": "leaf-1"},
    {"name": "dgx-h-[01-02]", "model": "dgx-h100", "rack": "rack-1", "switch": "leaf-2"},
    {"name": "dgx-v-[01-02]", "model": "dgx-1v", "rack": "rack-2", "switch": "leaf-3"},
]}


def role(name: str = "main", gpus: int = 0, replicas: int = 1, **extra) -> dict:
    return {"name": name, "replicas": replicas, "gpus": gpus, "cpus": 8, "memory": "32GiB",
            **extra}


# (team, spec, idempotency key, what the test drives it to)
JOBS = [
    ("nlp", {"name": "data-prep", "expected_runtime": "10m",
             "roles": [role(gpus=4, gpu={"model": ["V100"]})]}, None, "succeeded"),
    ("vision", {"name": "vision_pipeline.train", "job_class": "pytorch", "priority": 10,
                "expected_runtime": "2h", "roles": [role("worker", gpus=8,
                                                         gpu={"model": ["A100"]})]},
     TRAIN_KEY, "running"),
    ("vision", {"name": "vit-large", "expected_runtime": "3h",
                "roles": [role("worker", gpus=8, gpu={"model": ["H100"]})]}, None, "running"),
    ("nlp", {"name": "bert-finetune", "job_class": "pytorch", "expected_runtime": "1h",
             "time_limit": "6h",
             "roles": [role("worker", gpus=4, replicas=2, gpu={"model": ["V100"]})],
             "placement": {"locality": "switch"}}, None, "admitted"),
    ("nlp", {"name": "etl-features", "job_class": "etl", "expected_runtime": "30m",
             "roles": [role(cpus=16)]}, None, "running"),
    ("nlp", {"name": "llm-pretrain", "priority": 50, "expected_runtime": "12h",
             "roles": [role("worker", gpus=6, replicas=2, gpu={"model": ["A100"]})],
             "placement": {"locality": "switch"}}, None, "pending"),
    ("vision", {"name": "sweep-small", "expected_runtime": "1h",
                "roles": [role(gpus=4, gpu={"model": ["H100", "A100"]})]}, None, "pending"),
    # nlp's guarantee covers it and only the H100s vision borrowed could hold it: it
    # reclaims them, and vit-large stays `preempting` for the session (its grace is an hour)
    ("nlp", {"name": "urgent-eval", "priority": 100, "expected_runtime": "30m",
             "roles": [role("worker", gpus=8, gpu={"model": ["H100"]})]}, None, "pending"),
]
# Guarantees that sum to the cluster's 48 GPUs: vision may borrow 8 beyond its 8, so its
# second job (vit-large) runs on GPUs of nlp's idle guarantee (vision borrows 8, nlp lends
# 8) until nlp reclaims them
TEAMS = {"vision": {"share": 2.0, "quota_gpus": 8, "borrow_gpus": 8},
         "nlp": {"share": 1.0, "quota_gpus": 40}}
POLICY = {"stop_grace": 3600,           # a victim's grace (its class sets none): an hour
          "preemption": {"min_run_time": 0}}


class Scheduler:
    """A scheduler-core server on a cluster and a policy, with a token per team (and
    `airflow-ui`, `admin`). Leases last an hour, so admitted jobs stay admitted for the
    whole session."""

    def __init__(self, tmp: Path, cluster: dict, policy: dict, teams: tuple[str, ...],
                 interval: float = 0.1):
        tmp.mkdir(parents=True, exist_ok=True)
        cluster_file, policy_file = tmp / "cluster.yaml", tmp / "policy.yaml"
        cluster_file.write_text(yaml.safe_dump(cluster))
        policy_file.write_text(yaml.safe_dump(policy))
        self.db = f"sqlite:///{tmp}/scheduler.db"
        self.server = Server(self.db, cluster_file, lease_ttl=3600,
                             log=tmp / "scheduler.log", interval=interval,
                             args=("--host-timeout", str(HOST_TIMEOUT),
                                   "--policy-file", str(policy_file)))
        self.url = self.server.url
        engine = make_engine(self.db)
        made = sessions(engine)
        self.tokens = {t: create_token(made, t) for t in (*teams, "airflow-ui")}
        self.tokens["admin"] = create_token(made, "ops", admin=True)
        engine.dispose()
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def call(self, method: str, path: str, who: str = "admin", **kw) -> dict | list:
        r = self.http.request(method, path, headers={
            "Authorization": f"Bearer {self.tokens[who]}"}, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    def host(self, name: str) -> dict:
        return next(h for h in self.call("GET", "/api/v1/cluster")["hosts"]
                    if h["name"] == name)

    def connection(self) -> str:
        return json.dumps({"conn_type": "gpu_scheduler", "host": "127.0.0.1",
                           "port": self.server.port, "password": self.tokens["airflow-ui"]})

    def stop(self) -> None:
        self.http.close()
        self.server.stop()


class DemoScheduler(Scheduler):
    """The scheduler-core with the demo cluster and jobs."""

    def __init__(self, tmp: Path):
        super().__init__(tmp, CLUSTER, POLICY, ("vision", "nlp"))
        self.ids: dict[str, str] = {}

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.call("GET", f"/api/v1/jobs/{job_id}")
            if job["state"] in states and (job["state"] != "pending" or job["pending"]["code"]):
                return job
            assert time.monotonic() < deadline, f"job {job_id} stayed {job['state']}"
            time.sleep(0.1)

    def populate(self) -> None:
        self.set_up_hosts_and_teams()
        self.submit_jobs()
        self.report_utilization()

    def set_up_hosts_and_teams(self) -> None:
        for team, body in TEAMS.items():
            self.call("PUT", f"/api/v1/teams/{team}", json=body)
        host, index, reason = UNHEALTHY
        self.call("POST", f"/api/v1/hosts/{host}/report",
                  json={"gpus": [{"index": index, "healthy": False, "reason": reason}]})
        self.call("POST", f"/api/v1/hosts/{DRAINED}/drain")
        self.call("PUT", f"/api/v1/hosts/{UNREACHABLE}", json={"topology": yaml.safe_load(
            (HOST_MODELS / "dgx-h100.yaml").read_text())})
        deadline = time.monotonic() + 30        # silent now: no job may land there
        while self.host(UNREACHABLE).get("reachable", False):
            assert time.monotonic() < deadline, f"{UNREACHABLE} stayed reachable"
            time.sleep(0.2)

    def submit_jobs(self) -> None:
        for team, spec, key, goal in JOBS:     # one at a time: placements are repeatable
            job = self.call("POST", "/api/v1/jobs", who=team,
                            json={"spec": spec, "idempotency_key": key})
            self.ids[spec["name"]] = job["id"]
            got = self.wait_state(job["id"], ("pending", "admitted"))
            assert (got["state"] == "pending") == (goal == "pending"), got
            if goal in ("running", "succeeded"):
                self.call("POST", f"/api/v1/jobs/{job['id']}/heartbeat", who=team)
            if goal == "succeeded":
                self.call("POST", f"/api/v1/jobs/{job['id']}/finish", who=team,
                          json={"outcome": "succeeded", "exit_code": 0})

    def report_utilization(self) -> None:
        for name, values in UTILIZATION.items():
            self.call("POST", f"/api/v1/hosts/{name}/report", json={"gpus": [
                {"index": i, "healthy": True, "utilization_gpu": u,
                 "utilization_memory": u * 0.6, "memory_used_bytes": int(u * 0.8 * 2**30),
                 "power_watts": 100 + u * 5, "temperature_c": 40 + u * 0.3}
                for i, u in enumerate(values)]})

class AirflowApi:
    """`airflow api-server` with the plugin (found through its entry point)."""

    def __init__(self, tmp: Path, connection: str, log: Path | None = None,
                 refresh: int = 1, conn_id: str = "gpu_scheduler_default"):
        self.home = tmp / "airflow-home"
        self.home.mkdir(parents=True, exist_ok=True)
        passwords = self.home / "passwords.json"
        passwords.write_text(json.dumps(USERS))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ, "AIRFLOW_HOME": str(self.home), "PYTHONPATH": PYTHONPATH,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                           "simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": "plugin-tests-secret-" + "0123456789abcdef" * 4,
            "AIRFLOW__GPU_SCHEDULER__UI_REFRESH_SECONDS": str(refresh),
            "AIRFLOW__GPU_SCHEDULER__UI_CONN_ID": conn_id,
        }
        for name in ("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS",
                     "AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT"):   # the caller's would win
            self.env.pop(name, None)
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env,
                       check=True, capture_output=True, timeout=300)
        # in the metadata DB, as an admin would create it in the UI (the API server reads
        # it through its metastore secrets backend)
        subprocess.run([sys.executable, "-m", "airflow", "connections", "add",
                        conn_id, "--conn-json", connection], env=self.env,
                       check=True, capture_output=True, timeout=120)
        self.log = log or tmp / "api-server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"], env=self.env, cwd=self.home,
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))  # noqa: SIM115
        deadline = time.monotonic() + 180
        while not self._up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("airflow api-server did not start:\n"
                                     + self.log.read_text()[-4000:])
            time.sleep(0.25)

    def _up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/api/v2/version", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def token(self, user: str = "viewer") -> str:
        r = httpx.post(f"{self.url}/auth/token", timeout=30,
                       json={"username": user, "password": USERS[user]})
        assert r.status_code == 201, r.text
        return r.json()["access_token"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Stack:
    """A scheduler-core, populated, and an Airflow API server whose plugin reads it
    through connection `conn_id`."""

    def __init__(self, tmp: Path, scheduler: Scheduler, conn_id: str = "gpu_scheduler_default",
                 refresh: int = 1):
        self.scheduler = scheduler
        try:
            scheduler.populate()
            self.airflow = AirflowApi(tmp, scheduler.connection(), conn_id=conn_id,
                                      refresh=refresh)
        except BaseException:
            scheduler.stop()
            raise
        self.url = self.airflow.url

    def stop(self) -> None:
        self.airflow.stop()
        self.scheduler.stop()
