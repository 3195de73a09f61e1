"""The service's side of the node agents, through FastAPI's test client on SQLite and
PostgreSQL: registering hosts (validation, rights, a file host's model replaced, a model
that cannot hold what runs), the per-class policy for jobs on a failed GPU (requeue,
cancel, keep), unreachable hosts, utilization in the cluster view and /metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from airflow_gpu.scheduler_core.api.app import create_app
from airflow_gpu.scheduler_core.engine.topology import load_topology
from airflow_gpu.scheduler_core.jobclasses import JobClass
from airflow_gpu.scheduler_core.plugins import hookimpl, make_registry
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Service, Settings
from airflow_gpu.scheduler_core.store.models import CpuHoldRow, GpuHoldRow, HostRow
from tests.helpers import make_cluster

HOSTS = ({"name": "dgx-1", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


class _Classes:
    @hookimpl
    def airflow_gpu_job_classes(self):
        return [JobClass("fragile", "ends on a GPU fault", on_gpu_failure="cancel"),
                JobClass("stubborn", "runs on through a GPU fault", on_gpu_failure="keep")]


@pytest.fixture
def api(db_url):
    reg = make_registry(extra_plugins=(_Classes(),))
    service = Service(Settings(db_url, make_cluster(*HOSTS), lease_ttl=30), reg)
    app = create_app(service, run_loop=False)
    tokens = {"vision": create_token(service.sessions, "vision"),
              "admin": create_token(service.sessions, "ops", admin=True)}
    with TestClient(app) as client:
        client.tokens, client.tick, client.service = tokens, app.state.loop.tick, service
        yield client
    service.engine.dispose()


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def register(api, name: str, model: str = "dgx-h100", who: str = "admin", **extra):
    body = {"topology": load_topology(model).document(), "rack": "r2", "switch": "s2", **extra}
    return api.put(f"/api/v1/hosts/{name}", json=body, headers=auth(api, who))


def report(api, name: str, gpus: list[dict]):
    r = api.post(f"/api/v1/hosts/{name}/report", json={"gpus": gpus}, headers=auth(api, "admin"))
    assert r.status_code == 200, r.text
    return r


def submit(api, name: str, gpus: int, replicas: int = 1, model: str | None = None,
           **fields) -> dict:
    role = {"name": "w", "replicas": replicas, "gpus": gpus}
    if model:
        role["gpu"] = {"model": model}
    spec = {"name": name, "expected_runtime": "1h", **fields, "roles": [role]}
    r = api.post("/api/v1/jobs", json={"spec": spec}, headers=auth(api, "vision"))
    assert r.status_code == 201, r.text
    return r.json()


def job(api, job_id: str) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}", headers=auth(api, "vision")).json()


def events(api, job_id: str) -> list[dict]:
    return api.get(f"/api/v1/jobs/{job_id}/explain", headers=auth(api, "vision")).json()["events"]


def start(api, spec_job: dict) -> dict:
    assert spec_job["id"] in api.tick()
    r = api.post(f"/api/v1/jobs/{spec_job['id']}/heartbeat", headers=auth(api, "vision"))
    assert r.json()["state"] == "running"
    return r.json()


def test_registration_needs_an_admin_and_a_valid_model(api):
    assert register(api, "n1", who="vision").status_code == 403
    bad = load_topology("dgx-a100").document()
    bad["gpus"][0]["numa_node"] = 9
    r = api.put("/api/v1/hosts/n1", json={"topology": bad}, headers=auth(api, "admin"))
    assert r.status_code == 422 and "numa_node: 9 is not one of" in r.text
    r = register(api, "bad name")
    assert r.status_code == 422
    r = api.post("/api/v1/hosts/n9/report", json={"gpus": []}, headers=auth(api, "admin"))
    assert r.status_code == 404 and "its node agent registers it" in r.text


def test_a_registered_host_joins_the_cluster_and_can_leave_it(api):
    r = register(api, "n1", labels={"zone": "b"}, docker_url="tcp://n1:2375")
    assert r.status_code == 200, r.text
    host = r.json()
    assert (host["model"], host["rack"], host["switch"], host["docker_url"], host["agent"]) == (
        "dgx-h100", "r2", "s2", "tcp://n1:2375", True)
    a = submit(api, "h100", 8, model="H100", job_class="pytorch")
    assert api.tick() == [a["id"]]
    view = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()
    assert [h["name"] for h in view["hosts"]] == ["dgx-1", "n1"]
    assert view["gpus_total"] == 16
    r = api.delete("/api/v1/hosts/n1", headers=auth(api, "admin"))
    assert r.status_code == 409 and "drain the host" in r.text       # a job runs there
    api.delete(f"/api/v1/jobs/{a['id']}", headers=auth(api, "vision"))
    assert api.delete("/api/v1/hosts/n1", headers=auth(api, "admin")).status_code == 204
    view = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()
    assert [h["name"] for h in view["hosts"]] == ["dgx-1"]


def test_a_file_hosts_model_is_replaced_unless_it_cannot_hold_its_jobs(api):
    r = register(api, "dgx-1", model="dgx-h100")       # what NVML reports wins
    assert r.status_code == 200
    host = r.json()
    assert host["model"] == "dgx-h100" and (host["rack"], host["switch"]) == ("r1", "s1")
    big = submit(api, "big", 8, model="H100")
    start(api, big)
    half = load_topology("dgx-h100").document()       # the same host with 4 GPUs left
    half["gpus"] = half["gpus"][:4]
    for g in half["gpus"]:
        g["nvlink_peers"] = {p: n for p, n in g["nvlink_peers"].items() if int(p) < 4}
    for n in half["nics"]:
        n["pxb_gpus"] = [i for i in n.get("pxb_gpus", []) if i < 4]
    del half["topo_matrix"]
    r = api.put("/api/v1/hosts/dgx-1", json={"topology": half}, headers=auth(api, "admin"))
    assert r.status_code == 409 and f"job {big['id']} holds GPUs 4,5,6,7" in r.text
    assert "drain the host" in r.text


@pytest.mark.parametrize("job_class, state, kind", [
    ("pytorch", "pending", "requeued"),
    ("fragile", "cancelled", "cancelled"),
    ("stubborn", "running", "gpu_fault"),
])
def test_jobs_on_a_failed_gpu_follow_their_class(api, job_class, state, kind):
    register(api, "n1")
    register(api, "n2")
    gang = submit(api, "gang", 8, replicas=3, job_class=job_class)   # all three hosts
    start(api, gang)
    hosts = {r["host"] for r in job(api, gang["id"])["replicas"]}
    assert len(hosts) == 3
    report(api, "n2", [{"index": 5, "healthy": False, "reason": "XID 79"}])
    got = job(api, gang["id"])
    assert got["state"] == state and got["id"] == gang["id"]
    assert got["gpu_fault"] == "GPU n2:5 (XID 79) unhealthy"
    flagged = [e for e in events(api, gang["id"]) if e["kind"] == kind]
    assert len(flagged) == 1 and "n2:5 (XID 79)" in flagged[0]["message"]
    with api.service.sessions() as s:
        holds = s.scalar(select(func.count()).select_from(GpuHoldRow)) + s.scalar(
            select(func.count()).select_from(CpuHoldRow))
    live = [r["live"] for r in got["replicas"]]
    if state == "running":
        assert holds and all(live)
    else:                            # the whole gang, on all three hosts, at once
        assert holds == 0 and not any(live)
    r = api.post(f"/api/v1/jobs/{gang['id']}/heartbeat", headers=auth(api, "vision"))
    if state == "pending":
        assert r.status_code == 409 and "is pending" in r.json()["detail"]
    report(api, "n2", [{"index": 5, "healthy": False, "reason": "XID 79"}])
    assert len([e for e in events(api, gang["id"]) if e["kind"] == kind]) == 1   # once


def test_a_requeued_job_runs_again_elsewhere_and_is_handled_again(api):
    register(api, "n1")
    a = submit(api, "a", 8, job_class="pytorch")
    start(api, a)
    first = job(api, a["id"])["replicas"][0]["host"]
    report(api, first, [{"index": 0, "healthy": False, "reason": "XID 79"}])
    assert job(api, a["id"])["state"] == "pending"
    assert api.tick() == [a["id"]]
    again = job(api, a["id"])
    assert again["state"] == "admitted"
    live = [r for r in again["replicas"] if r["live"]]
    assert live[0]["host"] != first
    report(api, live[0]["host"], [{"index": 2, "healthy": False, "reason": "XID 48"}])
    assert job(api, a["id"])["state"] == "pending"
    assert [e["kind"] for e in events(api, a["id"])].count("requeued") == 2


def test_a_silent_host_is_unreachable_until_it_reports(api):
    register(api, "n1")
    with api.service.sessions.begin() as s:
        s.get(HostRow, "n1").reported_at = datetime.now(UTC) - timedelta(hours=1)
    a = submit(api, "h100", 8, model="H100", job_class="pytorch")
    assert api.tick() == []             # silent for an hour; the timeout is 60 s
    view = {h["name"]: h for h in api.get("/api/v1/cluster",
                                          headers=auth(api, "vision")).json()["hosts"]}
    assert view["n1"]["reachable"] is False and view["dgx-1"]["reachable"] is True
    assert 'airflow_gpu_host_reachable{host="n1"} 0.0' in api.get("/metrics").text
    report(api, "n1", [])
    assert api.get("/api/v1/cluster", headers=auth(api, "vision")).json()["hosts"][1][
        "reachable"] is True
    assert api.tick() == [a["id"]]


def test_utilization_in_the_cluster_view_and_metrics(api):
    register(api, "n1")
    sample = {"index": 2, "healthy": True, "utilization_gpu": 97.0,
              "utilization_memory": 40.5, "memory_used_bytes": 2**35, "power_watts": 612.5,
              "temperature_c": 71.0}
    report(api, "n1", [sample])
    gpu = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()["hosts"][1]["gpus"][2]
    assert {k: gpu[k] for k in sample if k not in ("index", "healthy")} == {
        k: v for k, v in sample.items() if k not in ("index", "healthy")}
    report(api, "n1", [{"index": 2, "healthy": True}])      # no sample: values stay
    gpu = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()["hosts"][1]["gpus"][2]
    assert gpu["utilization_gpu"] == 97.0
    text = api.get("/metrics").text
    assert 'airflow_gpu_gpu_utilization_percent{gpu="2",host="n1"} 97.0' in text
    assert 'airflow_gpu_gpu_power_watts{gpu="2",host="n1"} 612.5' in text
    assert "airflow_gpu_gpu_memory_used_bytes{gpu=\"2\",host=\"n1\"} 3.4359738368e+10" in text
    r = api.post("/api/v1/hosts/n1/report", json={"gpus": [{**sample, "utilization_gpu": 101}]},
                 headers=auth(api, "admin"))
    assert r.status_code == 422 and "utilization_gpu" in r.text


def test_a_cluster_of_agents_only(db_url):
    """The cluster file may list no host at all: agents bring them."""
    service = Service(Settings(db_url, make_cluster(name="agents-only")))
    app = create_app(service, run_loop=False)
    with TestClient(app) as client:
        client.tokens = {"vision": create_token(service.sessions, "vision"),
                         "admin": create_token(service.sessions, "ops", admin=True)}
        r = client.post("/api/v1/jobs", json={"spec": {"name": "x", "roles": [
            {"name": "w", "gpus": 1}]}}, headers=auth(client, "vision"))
        assert r.status_code == 422 and "the cluster has no GPUs" in r.text
        assert register(client, "n1").status_code == 200
        a = submit(client, "x", 1)
        assert app.state.loop.tick() == [a["id"]]
    service.engine.dispose()


def test_a_busy_host_keeps_its_model_until_it_is_empty(api):
    """A host with live allocations cannot become another model (its jobs were placed on
    H100s and their NICs), nor change where they were launched (the Docker URL); the
    changes apply once the host is empty. A re-registration that changes nothing the jobs
    depend on is accepted."""
    assert register(api, "n1", model="dgx-h100").status_code == 200
    a = submit(api, "h100", 8, model="H100", job_class="pytorch")
    start(api, a)
    placed = job(api, a["id"])["replicas"]
    assert [r["host"] for r in placed] == ["n1"]
    r = register(api, "n1", model="dgx-1v")
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    for part in ("host n1", a["id"], "GPUs 0-7: NVIDIA H100 80GB HBM3 -> Tesla V100-SXM2-16GB",
                 "GPU memory of GPUs 0-7: 80 GiB -> 16 GiB", "NUMA nodes: 0 (CPUs 0-55,112-167",
                 "NICs: mlx5_0..mlx5_11 -> mlx5_0..mlx5_3",
                 "drain the host (airflow-gpu drain n1), let its jobs end, then restart the "
                 "agent"):
        assert part in detail, (part, detail)
    now = job(api, a["id"])
    assert now["state"] == "running" and now["replicas"] == placed
    api.tick()
    host = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()["hosts"][1]
    assert host["model"] == "dgx-h100"
    assert {g["name"] for g in host["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert all(g["job"] == a["id"] for g in host["gpus"])
    # the same model at a new Docker URL: its jobs were launched at the old one
    r = register(api, "n1", model="dgx-h100", docker_url="tcp://n1:2376")
    assert r.status_code == 409, r.text
    assert "docker_url: none -> tcp://n1:2376" in r.json()["detail"]
    r = register(api, "n1", model="dgx-h100")          # nothing its jobs use changes
    assert r.status_code == 200, r.text
    assert r.json()["docker_url"] is None and r.json()["model"] == "dgx-h100"
    assert job(api, a["id"])["replicas"] == placed
    r = api.post(f"/api/v1/jobs/{a['id']}/finish", json={"outcome": "succeeded"},
                 headers=auth(api, "vision"))
    assert r.status_code == 200
    r = register(api, "n1", model="dgx-1v", docker_url="tcp://n1:2376")  # empty now
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "dgx-1v" and r.json()["docker_url"] == "tcp://n1:2376"
    assert {g["name"] for g in r.json()["gpus"]} == {"Tesla V100-SXM2-16GB"}


def _one_change(what: str) -> dict:
    """dgx-h100's model with one thing its jobs were placed on changed."""
    d = load_topology("dgx-h100").document()
    if what == "gpu model":
        for g in d["gpus"]:
            g["name"] = "NVIDIA H800"
    elif what == "gpu memory":
        for g in d["gpus"]:
            g["memory_mb"] = 40960
    elif what == "numa layout":
        for n in d["host"]["numa_nodes"]:
            n["memory_gb"] = 512.0
        d["host"]["memory_gb"] = 1024.0
    else:                                     # a NIC gone (GPU 7's)
        d["nics"] = [n for n in d["nics"] if n["name"] != "mlx5_11"]
        for sw in d["pcie_switches"]:
            sw["members"] = [m for m in sw["members"] if m != "mlx5_11"]
        d["topo_matrix"]["columns"].remove("mlx5_11")
        d["topo_matrix"]["rows"] = {k: {c: v for c, v in row.items() if c != "mlx5_11"}
                                    if isinstance(row, dict) else row
                                    for k, row in d["topo_matrix"]["rows"].items()
                                    if k != "mlx5_11"}
    return d


@pytest.mark.parametrize(("what", "told"), [
    ("gpu model", "GPUs 0-7: NVIDIA H100 80GB HBM3 -> NVIDIA H800"),
    ("gpu memory", "GPU memory of GPUs 0-7: 80 GiB -> 40 GiB"),
    ("numa layout", "NUMA nodes: 0 (CPUs 0-55,112-167, 1024 GiB), 1 (CPUs 56-111,168-223, "
     "1024 GiB) -> 0 (CPUs 0-55,112-167, 512 GiB), 1 (CPUs 56-111,168-223, 512 GiB)"),
    ("nics", "NICs: mlx5_0..mlx5_11 -> mlx5_0..mlx5_10"),
])
def test_each_change_a_busy_hosts_jobs_depend_on_waits_until_it_is_empty(api, what, told):
    """Each of GPU model, GPU memory, NUMA layout and NICs alone is refused (409) while a
    job that asks nothing of them (no GPU model, one GPU) runs on the host, drained or
    not; it applies once the host is empty."""
    assert register(api, "n1", model="dgx-h100").status_code == 200
    r = api.post("/api/v1/hosts/dgx-1/drain", headers=auth(api, "admin"))
    assert r.status_code == 200, r.text
    a = submit(api, "small", 1)
    start(api, a)
    assert [r["host"] for r in job(api, a["id"])["replicas"]] == ["n1"]
    body = {"topology": _one_change(what), "rack": "r2", "switch": "s2"}

    def again():
        return api.put("/api/v1/hosts/n1", json=body, headers=auth(api, "admin"))

    r = again()
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert f"what would change: {told}." in detail, detail
    assert a["id"] in detail and "drain the host (airflow-gpu drain n1)" in detail
    assert api.post("/api/v1/hosts/n1/drain", headers=auth(api, "admin")).status_code == 200
    assert again().status_code == 409                  # drained, but its job still runs
    host = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()["hosts"]
    (n1,) = [h for h in host if h["name"] == "n1"]
    assert {g["name"] for g in n1["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    r = api.post(f"/api/v1/jobs/{a['id']}/finish", json={"outcome": "succeeded"},
                 headers=auth(api, "vision"))
    assert r.status_code == 200
    r = again()                                        # drained and empty: taken
    assert r.status_code == 200, r.text
    assert api.post("/api/v1/hosts/n1/resume", headers=auth(api, "admin")).status_code == 200
    b = submit(api, "after", 8)
    assert api.tick() == [b["id"]]
    assert [r["host"] for r in job(api, b["id"])["replicas"]] == ["n1"]
