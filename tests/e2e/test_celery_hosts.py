"""Multi-machine Airflow as docs/deployment.md sets it up: CeleryExecutor with Redis,
the metadata database on PostgreSQL, one Celery worker per DGX host serving that host's
queue, a general worker on the default queue, and the scheduler-core on three simulated
hosts (this machine's CPUs, four declared GPUs each). Local-runner tasks ask for their
worker's host only, so each runs on the worker of the host it was admitted to, across a
deferral too; one without a host queue lands on the general worker and is refused before
anything is submitted; a Docker-runner task runs from the general worker."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.celery_stack import CeleryStack
from tests.e2e.conftest import DAGS, create_token, machine_model
from tests.servers import Server

DAG_ID = "gpu_celery_hosts"
HOSTS = ("dgx-01", "dgx-02", "dgx-03")


@pytest.fixture
def stack(tmp_path: Path, docker_engine):
    if not shutil.which("redis-server"):
        pytest.fail("no redis-server: run scripts/ensure-redis.sh (make test does)")
    cluster = tmp_path / "cluster.yaml"
    model = machine_model(tmp_path / "this-machine.yaml")
    cluster.write_text(yaml.safe_dump({"cluster": "e2e", "hosts": [
        {"name": h, "model": str(model), "rack": "r1", "switch": "s1"} for h in HOSTS]}))
    db = f"sqlite:///{tmp_path}/scheduler.db"
    core = Server(db, cluster, lease_ttl=20, log=tmp_path / "scheduler-core.log",
                  interval=0.2)
    token = create_token(db, "ml")
    host, port = core.url.removeprefix("http://").split(":")
    conn = json.dumps({"conn_type": "gpu_scheduler", "host": host, "port": int(port),
                       "password": token})
    workers = {h: (h, h) for h in HOSTS}
    workers["general"] = ("default", "cpu-worker-1")   # no GPU host: Docker-runner work
    try:
        s = CeleryStack(tmp_path, DAGS / "gpu_celery_hosts.py", conn, workers)
    except BaseException:
        core.stop()
        raise
    s.core, s.admin = core, create_token(db, "ops", "--admin")
    yield s
    s.stop()
    core.stop()


def test_local_runner_tasks_run_on_the_worker_of_their_admitted_host(stack):
    started = time.monotonic()
    run_id = stack.trigger(DAG_ID)
    states = stack.wait_run(DAG_ID, run_id)
    logs = {t: stack.task_log(DAG_ID, run_id, t) for t in states}
    shown = "\n".join(f"--- {t}\n{log[-2500:]}" for t, log in logs.items())
    assert states == {"on_01": "success", "on_02": "success", "on_03_small": "success",
                      "on_03_whole": "success", "unrouted": "failed",
                      "in_container": "success"}, shown

    jobs = {j["name"].split(".", 1)[1]: j for j in httpx.get(
        f"{stack.core.url}/api/v1/jobs", headers={"Authorization": f"Bearer {stack.admin}"},
        timeout=10).raise_for_status().json()}
    queue = {"on_01": "dgx-01", "on_02": "dgx-02", "on_03_small": "dgx-03",
             "on_03_whole": "dgx-03"}
    for task, host in queue.items():
        ran = re.findall(r"RAN (\S+) granted (\S+) worker (\S+)", logs[task])
        assert ran == [("main-0", host, host)], (task, logs[task][-2500:])
        job = httpx.get(f"{stack.core.url}/api/v1/jobs/{jobs[task]['id']}", timeout=10,
                        headers={"Authorization": f"Bearer {stack.admin}"}).json()
        assert job["state"] == "succeeded"
        assert [r["host"] for r in job["replicas"]] == [host]
        assert job["spec"]["placement"]["hosts"] == [host]
    # one of the two dgx-03 tasks waited for the other's GPUs without a worker slot and
    # resumed on the dgx-03 worker
    assert any("(deferred)" in logs[t] for t in ("on_03_small", "on_03_whole")), shown
    assert re.search(r"RAN in a container on dgx-0\d", logs["in_container"]), shown

    refused = logs["unrouted"]
    assert "unrouted" not in jobs           # refused before anything was submitted
    for part in ("task 'unrouted' uses the local runner", "this worker is 'cpu-worker-1'",
                 "no host of the cluster 'e2e'", "queue 'default'",
                 "Nothing was submitted", "queue='dgx-01' on the operator"):
        assert part in refused, refused[-3000:]
    print(f"run took {time.monotonic() - started:.1f}s")
