"""A 128-host cluster for the compact cluster view (tests and `scripts/screenshots.py`):
8 racks of 2 leaf switches with 8 DGX hosts each (1,024 GPUs), filled by three teams'
jobs through the batch endpoint, with unhealthy GPUs, drained hosts and a host whose
node agent fell silent."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import yaml

from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, sessions
from tests.plugin.stack import HOST_MODELS, HOST_TIMEOUT, role
from tests.service.servers import Server

RACKS, SWITCHES_PER_RACK, HOSTS_PER_SWITCH = 8, 2, 8
BIG_UNHEALTHY = [("dgx-017", 3, "XID 79: GPU has fallen off the bus"),
                 ("dgx-090", 0, "double-bit ECC error")]
BIG_DRAINED = {"dgx-040": "fan replacement", "dgx-041": "fan replacement"}
BIG_UNREACHABLE = "dgx-127"
TEAMS = ("vision", "nlp", "speech")


def big_cluster() -> dict:
    """dgx-001..dgx-128; racks 7 and 8 hold A100 hosts, the others H100 hosts."""
    hosts, n = [], 1
    for r in range(1, RACKS + 1):
        for s in range(SWITCHES_PER_RACK):
            leaf = (r - 1) * SWITCHES_PER_RACK + s + 1
            hosts.append({"name": f"dgx-[{n:03d}-{n + HOSTS_PER_SWITCH - 1:03d}]",
                          "model": "dgx-a100" if r > 6 else "dgx-h100",
                          "rack": f"rack-{r:02d}", "switch": f"leaf-{leaf:02d}"})
            n += HOSTS_PER_SWITCH
    return {"cluster": "big", "hosts": hosts}


def big_jobs() -> list[tuple[str, dict]]:
    """Whole hosts, halves, small jobs and gangs under one switch that hold most of the
    GPUs, plus 6-host gangs of which some wait."""
    jobs = []
    for i in range(100):
        team = TEAMS[i % 3]
        if i % 5 == 0:      # a 2-host gang under one switch
            spec = {"name": f"{team}-gang-{i:02d}", "expected_runtime": "4h",
                    "roles": [role("worker", gpus=8, replicas=2)],
                    "placement": {"locality": "switch"}}
        else:
            spec = {"name": f"{team}-job-{i:02d}", "expected_runtime": "2h",
                    "roles": [role(gpus=(8, 4, 2, 1)[i % 4])]}
        jobs.append((team, spec))
    for i in range(12):     # more than fits: the first to wait gets a reservation
        jobs.append((TEAMS[i % 3], {"name": f"{TEAMS[i % 3]}-pretrain-{i:02d}",
                                    "expected_runtime": "12h",
                                    "roles": [role("worker", gpus=8, replicas=6)],
                                    "placement": {"locality": "switch"}}))
    return jobs


class BigScheduler:
    """The scheduler-core with the 128-host cluster, filled. Leases last an hour."""

    def __init__(self, tmp: Path):
        tmp.mkdir(parents=True, exist_ok=True)
        cluster = tmp / "cluster.yaml"
        cluster.write_text(yaml.safe_dump(big_cluster()))
        policy = tmp / "policy.yaml"          # the first waiting gang gets a reservation
        policy.write_text(yaml.safe_dump({"reserve_after": 0}))
        self.db = f"sqlite:///{tmp}/scheduler.db"
        self.server = Server(self.db, cluster, lease_ttl=3600, log=tmp / "scheduler.log",
                             interval=0.2, args=("--host-timeout", str(HOST_TIMEOUT),
                                                 "--policy-file", str(policy)))
        self.url = self.server.url
        engine = make_engine(self.db)
        made = sessions(engine)
        self.tokens = {t: create_token(made, t) for t in (*TEAMS, "airflow-ui")}
        self.tokens["admin"] = create_token(made, "ops", admin=True)
        engine.dispose()
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def call(self, method: str, path: str, who: str = "admin", **kw) -> dict | list:
        r = self.http.request(method, path, headers={
            "Authorization": f"Bearer {self.tokens[who]}"}, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    def populate(self) -> None:
        for host, index, reason in BIG_UNHEALTHY:
            self.call("POST", f"/api/v1/hosts/{host}/report",
                      json={"gpus": [{"index": index, "healthy": False, "reason": reason}]})
        for host, reason in BIG_DRAINED.items():
            self.call("POST", f"/api/v1/hosts/{host}/drain", json={"reason": reason})
        self.call("PUT", f"/api/v1/hosts/{BIG_UNREACHABLE}", json={
            "topology": yaml.safe_load((HOST_MODELS / "dgx-h100.yaml").read_text())})
        by_team: dict[str, list[dict]] = {}
        for team, spec in big_jobs():
            by_team.setdefault(team, []).append({"spec": spec})
        deadline = time.monotonic() + 30        # silent now: no job may land there
        while self.host(BIG_UNREACHABLE).get("reachable", False):
            assert time.monotonic() < deadline, f"{BIG_UNREACHABLE} stayed reachable"
            time.sleep(0.2)
        for team, jobs in by_team.items():
            self.call("POST", "/api/v1/jobs/batch", who=team, json={"jobs": jobs})
        deadline = time.monotonic() + 60
        while not self.planned():
            assert time.monotonic() < deadline, "the scheduler did not plan the jobs"
            time.sleep(0.3)

    def planned(self) -> bool:
        """Every job placed or given its reason, and the wait guarantee's reservation made
        for the first waiting job (reserve_after 0: from the pass after it was queued)."""
        queue = self.call("GET", "/api/v1/queue", params={"state": "pending"})
        return all((j.get("pending") or {}).get("code") for j in queue) and bool(
            queue and queue[0]["pending"]["details"].get("reserved_hosts"))

    def host(self, name: str) -> dict:
        return next(h for h in self.call("GET", "/api/v1/cluster")["hosts"]
                    if h["name"] == name)

    def connection(self) -> str:
        return json.dumps({"conn_type": "gpu_scheduler", "host": "127.0.0.1",
                           "port": self.server.port, "password": self.tokens["airflow-ui"]})

    def stop(self) -> None:
        self.http.close()
        self.server.stop()
