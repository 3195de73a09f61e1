"""A 128-host cluster for the compact cluster view (tests and `scripts/screenshots.py`):
8 racks of 2 leaf switches with 8 DGX hosts each (1,024 GPUs), filled by three teams'
jobs through the batch endpoint, with unhealthy GPUs, drained hosts and a host whose
node agent fell silent."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tests.plugin.stack import HOST_MODELS, Scheduler, role

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


class BigScheduler(Scheduler):
    """The scheduler-core with the 128-host cluster, filled; the first waiting job gets a
    reservation (reserve_after 0). A pass a second: submits wake the loop anyway, and a
    pass over 1,024 GPUs five times a second kept a core an eighth busy for nothing."""

    def __init__(self, tmp: Path):
        super().__init__(tmp, big_cluster(), {"reserve_after": 0}, TEAMS, interval=1.0)

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
