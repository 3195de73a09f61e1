"""A scheduler-core on SQLite with one host (this machine, 4 declared GPUs), and the
environment `airflow-gpu run` needs to reach it from this machine as that host."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from tests.e2e.conftest import create_token, machine_model
from tests.helpers import PYTHONPATH
from tests.servers import Server


@contextlib.contextmanager
def serve(tmp: Path, lease_ttl: float = 60, **policy) -> Iterator[dict]:
    """{"env", "admin" (an admin client), "team" (a client of team ml), "url", "tmp"};
    `policy`: the queue policy file's settings, e.g. stop_grace=2."""
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "run", "hosts": [
        {"name": "host-1", "model": str(machine_model(tmp / "this-machine.yaml")),
         "rack": "r1", "switch": "s1"}]}))
    args: tuple[str, ...] = ()
    if policy:
        (tmp / "policy.yaml").write_text(yaml.safe_dump(policy))
        args = ("--policy-file", str(tmp / "policy.yaml"))
    db = f"sqlite:///{tmp}/scheduler.db"
    srv = Server(db, cluster, lease_ttl=lease_ttl, log=tmp / "server.log", interval=0.2,
                 args=args)
    token = create_token(db, "ml")
    admin = httpx.Client(base_url=srv.url, timeout=10, headers={
        "Authorization": f"Bearer {create_token(db, 'ops', '--admin')}"})
    team = httpx.Client(base_url=srv.url, timeout=10,
                        headers={"Authorization": f"Bearer {token}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__GPU_SCHEDULER")}
    env.update(AIRFLOW_GPU_URL=srv.url, AIRFLOW_GPU_TOKEN=token,
               AIRFLOW_GPU_LOCAL_HOST="host-1", PYTHONPATH=PYTHONPATH)
    try:
        yield {"env": env, "admin": admin, "team": team, "url": srv.url, "token": token,
               "tmp": tmp}
    finally:
        admin.close()
        team.close()
        srv.stop()
