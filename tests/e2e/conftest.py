"""Real Airflow (`dag.test()` on SQLite in a temporary AIRFLOW_HOME), the real
scheduler-core on a loopback port, and the machine's Docker engine.

The cluster is two simulated hosts whose model is *this* machine (its CPUs and NUMA
nodes, plus four declared GPUs), so cpusets, NUMA memory nodes and memory limits from the
placement can really be applied and read back. Since every host is this machine, Airflow
runs with `[gpu_scheduler] local_host = *`: the local runner starts the replicas of every
host here (a test may set another value)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from airflow_gpu.scheduler_core.engine.topology import format_cpulist
from tests.forks import ForkServer
from tests.helpers import PYTHONPATH, REPO, until
from tests.servers import Server

IMAGE = "airflow-gpu-test/busybox:1"
DAGS = Path(__file__).parent / "dags"
GPUS = 4


def machine_model(path: Path) -> Path:
    """A gpu-topology/v1 file for this machine: its CPUs, one NUMA node, 4 declared GPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    gpus = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920,
             "numa_node": 0, "cpu_affinity": format_cpulist(cpus),
             "pcie_switch": f"sw{i // 2}",
             "nvlink_peers": {j: 12 for j in range(GPUS) if j != i}} for i in range(GPUS)]
    path.write_text(yaml.safe_dump({
        "schema": "gpu-topology/v1", "model": "this-machine",
        "host": {"cpu_model": "test", "sockets": 1, "cores_per_socket": len(cpus),
                 "threads_per_core": 1, "total_cores": len(cpus),
                 "total_threads": len(cpus), "memory_gb": 8,
                 "numa_nodes": [{"id": 0, "socket": 0, "cpus": format_cpulist(cpus),
                                 "memory_gb": 8}]},
        "nvlink": {"fabric": "nvswitch", "switches": 6, "links_per_gpu": 12},
        "pcie_switches": [{"id": f"sw{s}", "numa_node": 0,
                           "members": [f"GPU{2 * s}", f"GPU{2 * s + 1}", f"mlx5_{s}"]}
                          for s in range(GPUS // 2)],
        "gpus": gpus,
        "nics": [{"name": f"mlx5_{s}", "role": "compute", "numa_node": 0,
                  "pcie_switch": f"sw{s}", "pix_gpus": [2 * s, 2 * s + 1]}
                 for s in range(GPUS // 2)]}))
    return path


@pytest.fixture(scope="session")
def docker_engine():
    try:
        subprocess.run(["docker", "image", "inspect", IMAGE], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.fail(f"no Docker engine with the test image {IMAGE}: run "
                    "scripts/ensure-docker.sh (make test does)")
    return IMAGE


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow-home")
    env = airflow_env(home)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   capture_output=True, timeout=300)
    return home


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__GPU_SCHEDULER__LOCAL_HOST": "*",    # every simulated host is this one
            "PYTHONPATH": PYTHONPATH, **extra}


def create_token(db: str, team: str, *flags: str) -> str:
    """A token of `team` (`--admin`: an admin's) in the database at `db`, made in this
    process as `airflow-gpu token create` makes it (the CLI itself has its own tests)."""
    from airflow_gpu.scheduler_core.service.auth import create_token as made
    from airflow_gpu.scheduler_core.store.db import make_engine, sessions

    assert set(flags) <= {"--admin"}, flags
    engine = make_engine(db)
    try:
        return made(sessions(engine), team, admin="--admin" in flags)
    finally:
        engine.dispose()


class Scheduler:
    """A running scheduler-core with an admin token and a team token."""

    def __init__(self, tmp: Path, lease_ttl: float, hosts: int = 2,
                 args: tuple[str, ...] = ()):
        cluster = tmp / "cluster.yaml"
        model = machine_model(tmp / "this-machine.yaml")
        cluster.write_text(yaml.safe_dump({"cluster": "e2e", "hosts": [
            {"name": f"host-{i}", "model": str(model), "rack": "r1", "switch": "s1",
             "address": f"127.0.0.{i}"} for i in range(1, hosts + 1)]}))
        self.db = f"sqlite:///{tmp}/scheduler.db"
        self.server = Server(self.db, cluster, lease_ttl=lease_ttl, log=tmp / "server.log",
                             interval=0.2, args=args)
        self.url = self.server.url
        self.token = create_token(self.db, "ml")
        self.admin = create_token(self.db, "ops", "--admin")
        self.http = httpx.Client(base_url=self.url, timeout=10,
                                 headers={"Authorization": f"Bearer {self.admin}"})

    def connection(self) -> str:
        host, port = self.url.removeprefix("http://").split(":")
        return json.dumps({"conn_type": "gpu_scheduler", "host": host, "port": int(port),
                           "password": self.token})

    def jobs(self, **params) -> list[dict]:
        return self.http.get("/api/v1/jobs", params=params).raise_for_status().json()

    def job(self, job_id: str) -> dict:
        return self.http.get(f"/api/v1/jobs/{job_id}").raise_for_status().json()

    def events(self, job_id: str) -> list[dict]:
        return self.http.get(f"/api/v1/jobs/{job_id}/explain").raise_for_status().json()[
            "events"]

    def wait_for(self, predicate, timeout: float = 60, what: str = "condition"):
        return until(predicate, what, timeout, every=0.2)

    def stop(self) -> None:
        self.http.close()
        self.server.stop()


@pytest.fixture
def scheduler(request, tmp_path):
    """Two hosts by default; `@pytest.mark.parametrize("scheduler", [N], indirect=True)`
    for N hosts."""
    s = Scheduler(tmp_path, lease_ttl=4, hosts=getattr(request, "param", 2))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def dag_runs(airflow_home, tmp_path_factory):
    """Where `dag.test()` runs start: forked from a process that has imported Airflow
    (tests/forks.py)."""
    server = ForkServer(airflow_env(airflow_home), str(REPO),
                        str(tmp_path_factory.mktemp("forks") / "dag-test.sock"))
    yield server
    server.stop()


class DagRun:
    """`dag.test()` of a DAG file in its own process, with the scheduler's connection."""

    def __init__(self, runs: ForkServer, scheduler: Scheduler, dag_file: str, dag_id: str,
                 conf: dict | None = None, **env: str):
        self.proc = runs.start(
            [str(DAGS / dag_file), dag_id, json.dumps(conf or {})],
            airflow_env(Path(runs.env["AIRFLOW_HOME"]),
                        AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT=scheduler.connection(), **env))
        self.output = ""

    def result(self, timeout: float = 240) -> dict:
        self.output, _ = self.proc.communicate(timeout=timeout)
        lines = [x for x in self.output.splitlines() if x.startswith("DAG-RESULT ")]
        assert lines, f"dag.test() did not finish:\n{self.output[-6000:]}"
        return json.loads(lines[-1].removeprefix("DAG-RESULT "))


@pytest.fixture
def run_dag(dag_runs, scheduler, docker_engine):
    started: list[DagRun] = []

    def start(dag_file: str, dag_id: str, conf: dict | None = None, **env) -> DagRun:
        run = DagRun(dag_runs, scheduler, dag_file, dag_id, conf, **env)
        started.append(run)
        return run

    yield start
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    remove_containers(scheduler)


def remove_containers(scheduler: Scheduler) -> None:
    """Remove what `scheduler`'s jobs left on the Docker engine, and only that: the other
    test processes' schedulers have containers running there too."""
    import docker

    from airflow_gpu.launch.docker import SCHEDULER_LABEL

    engine = docker.from_env()
    ours = {"label": f"{SCHEDULER_LABEL}={scheduler.url}"}
    for c in engine.containers.list(all=True, filters=ours):
        c.remove(force=True)
    engine.close()
