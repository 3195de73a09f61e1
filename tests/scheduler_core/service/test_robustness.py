"""The service under load, crashes and failover, against real server processes on
SQLite and PostgreSQL: no GPU or core held twice, no acknowledged job lost."""

from __future__ import annotations

import random
import threading
import time
import traceback

import httpx
import pytest
from sqlalchemy import select

from airflow_gpu.scheduler_core.store.db import make_engine, sessions
from airflow_gpu.scheduler_core.store.models import (
    AllocationRow,
    CpuHoldRow,
    GpuHoldRow,
    JobRow,
)
from tests.helpers import until
from tests.servers import Server, prepared

CLUSTER = {"cluster": "load", "hosts": [
    {"name": "dgx-[1-4]", "model": "dgx-a100", "rack": "r1", "switch": "s1"}]}


@pytest.fixture
def setup(db_url, tmp_path):
    engine, token, cluster = prepared(db_url, tmp_path, CLUSTER, "load")
    servers: list[Server] = []
    yield {"db": db_url, "cluster": cluster, "token": token, "engine": engine,
           "start": lambda **kw: servers.append(Server(db_url, cluster, **kw)) or servers[-1]}
    for s in servers:
        s.stop()
    engine.dispose()


class Clients:
    """Client threads whose failures the test sees: an exception or a failed assert in a
    thread ends only that thread, and the test would pass without its checks. Each
    failure is kept, and `ok` and `join` fail the test with them in the main thread."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.failures: list[str] = []

    def start(self, target, *args) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:   # anything: the main thread reports it
                self.failures.append("".join(traceback.format_exception(exc)))

        t = threading.Thread(target=run, daemon=True)
        self.threads.append(t)
        t.start()

    def ok(self) -> bool:
        """True while no client has failed (for `until`, which then stops at once)."""
        assert not self.failures, "a client thread failed:\n" + "\n".join(self.failures)
        return True

    def join(self, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        self.ok()
        assert not any(t.is_alive() for t in self.threads), "a client thread never ended"


def job_body(i: int) -> dict:
    gpus = random.Random(i).choice((1, 1, 2, 4, 8))
    return {"spec": {"name": f"j{i}", "expected_runtime": "10m",
                     "roles": [{"name": "w", "gpus": gpus, "cpus": 2}]},
            "idempotency_key": f"key-{i}"}


def submit_many(url: str, token: str, ids: range, acked: dict, stop=None) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as c:
        for i in ids:
            if stop is not None and stop.is_set():
                return
            try:
                r = c.post("/api/v1/jobs", json=job_body(i))
            except httpx.TransportError:
                return                   # the server died: the job was not acknowledged
            assert r.status_code in (200, 201), r.text
            acked[f"key-{i}"] = r.json()["id"]


def check_store(engine) -> dict[str, JobRow]:
    """No GPU or core in two live allocations; holds are exactly the live allocations.
    Read as one snapshot: the server may be scheduling meanwhile."""
    if engine.dialect.name == "postgresql":
        engine = engine.execution_options(isolation_level="REPEATABLE READ")
    with sessions(engine)() as s:
        jobs = {j.id: j for j in s.scalars(select(JobRow))}
        live = list(s.scalars(select(AllocationRow).where(AllocationRow.live.is_(True))))
        gpu_holds = {(h.host, h.gpu): h.job_id for h in s.scalars(select(GpuHoldRow))}
        cpu_holds = {(h.host, h.cpu): h.job_id for h in s.scalars(select(CpuHoldRow))}
    gpus: dict = {}
    cpus: dict = {}
    for a in live:
        assert jobs[a.job_id].state in ("admitted", "running"), a.job_id
        for g in a.gpus:
            assert (a.host, g) not in gpus, f"GPU {a.host}:{g} held twice"
            gpus[(a.host, g)] = a.job_id
        for c in a.cpus:
            assert (a.host, c) not in cpus, f"CPU {a.host}:{c} held twice"
            cpus[(a.host, c)] = a.job_id
    assert gpus == gpu_holds and cpus == cpu_holds
    return jobs


def test_fifty_concurrent_submitters_and_a_churning_launcher(setup):
    server = setup["start"]()
    acked: dict[str, str] = {}
    stop = threading.Event()

    def launcher():   # finishes admitted jobs, so GPUs keep changing hands
        with httpx.Client(base_url=server.url, timeout=30,
                          headers={"Authorization": f"Bearer {setup['token']}"}) as c:
            while not stop.is_set():
                admitted = c.get("/api/v1/jobs", params={"state": "admitted"})
                assert admitted.status_code == 200, admitted.text
                for j in admitted.json()[:5]:
                    r = c.post(f"/api/v1/jobs/{j['id']}/finish",
                               json={"outcome": "succeeded"})
                    assert r.status_code == 200, r.text
                time.sleep(0.05)

    churn, submitters = Clients(), Clients()
    churn.start(launcher)
    for k in range(50):
        submitters.start(submit_many, server.url, setup["token"], range(k * 4, k * 4 + 4),
                         acked)
    submitters.join()
    time.sleep(1.0)
    stop.set()
    churn.join()
    jobs = check_store(setup["engine"])
    assert len(acked) == 200
    assert {j.idempotency_key: j.id for j in jobs.values()} == acked
    assert sum(j.state == "succeeded" for j in jobs.values()) > 0


def test_sigkill_mid_load_loses_nothing_acknowledged(setup):
    server = setup["start"]()
    acked: dict[str, str] = {}
    stop = threading.Event()
    clients = Clients()
    for k in range(8):
        clients.start(submit_many, server.url, setup["token"], range(k * 100, k * 100 + 100),
                      acked, stop)
    until(lambda: clients.ok() and len(acked) >= 40, "40 acknowledged jobs", 60, 0.01)
    server.kill()
    stop.set()
    clients.join()
    before = check_store(setup["engine"])
    assert set(acked.values()) <= set(before)
    # restart on the same database: everything is still there and scheduling resumes
    server = setup["start"]()
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {setup['token']}"}) as c:
        for job_id in acked.values():
            # the same state, or admitted since by the restarted scheduler
            now = c.get(f"/api/v1/jobs/{job_id}").json()["state"]
            assert now == before[job_id].state or (before[job_id].state, now) == (
                "pending", "admitted")
        running = [j["id"] for j in c.get("/api/v1/jobs", params={"state": "admitted"}).json()]
        for job_id in running:
            c.delete(f"/api/v1/jobs/{job_id}")
        deadline = time.monotonic() + 15
        while not c.get("/api/v1/jobs", params={"state": "admitted"}).json():
            assert time.monotonic() < deadline, "scheduling did not resume after restart"
            time.sleep(0.1)
    check_store(setup["engine"])


def test_failover_to_the_other_replica(setup):
    if not setup["db"].startswith("postgresql"):
        pytest.skip("several replicas need PostgreSQL; SQLite is single-process")
    a, b = setup["start"](), setup["start"]()
    deadline = time.monotonic() + 10
    while [a.healthy()["scheduling"], b.healthy()["scheduling"]].count(True) != 1:
        assert time.monotonic() < deadline, "no single leader"
        time.sleep(0.1)
    leader, other = (a, b) if a.healthy()["scheduling"] else (b, a)
    headers = {"Authorization": f"Bearer {setup['token']}"}
    first = httpx.post(f"{other.url}/api/v1/jobs", json=job_body(1), headers=headers).json()
    while httpx.get(f"{other.url}/api/v1/jobs/{first['id']}",
                    headers=headers).json()["state"] != "admitted":
        assert time.monotonic() < deadline + 10
        time.sleep(0.1)
    leader.kill()
    killed_at = time.monotonic()
    second = httpx.post(f"{other.url}/api/v1/jobs", json=job_body(2), headers=headers).json()
    while httpx.get(f"{other.url}/api/v1/jobs/{second['id']}",
                    headers=headers).json()["state"] != "admitted":
        assert time.monotonic() - killed_at < 10, "the other replica did not take over"
        time.sleep(0.1)
    assert other.healthy()["scheduling"] is True
    check_store(setup["engine"])


def test_a_failed_pass_does_not_cost_the_leadership(db_url):
    """A pass that raises gives the lock up and takes it again at the next round; the lock
    must really be released (a pooled connection would keep holding it, and the only
    replica would never schedule again)."""
    from sqlalchemy import text

    from airflow_gpu.scheduler_core.service.core import Service, Settings
    from airflow_gpu.scheduler_core.service.loop import SchedulerLoop
    from tests.helpers import make_cluster

    service = Service(Settings(db_url, make_cluster(*CLUSTER["hosts"])))
    loop = SchedulerLoop(service)
    other = make_engine(db_url)                   # another replica's view of the lock

    def lock_free() -> bool:
        if service.engine.dialect.name != "postgresql":
            return True                           # SQLite: one process, no lock
        with other.connect() as conn:
            key = {"k": loop.lock_key}
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), key)
            if got.scalar():
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), key)
                return True
            return False

    try:
        assert loop._lead() and loop.leader
        if service.engine.dialect.name == "postgresql":
            assert not lock_free()                # held while this replica leads
        loop._release()                           # what a failed pass does
        assert not loop.leader
        # the server drops the lock once its backend sees the connection closed: soon,
        # not necessarily before the next statement of another connection
        until(lock_free, "the advisory lock released", timeout=10)
        assert loop._lead() and loop.leader       # the same replica leads again
    finally:
        other.dispose()
        loop.stop()
        service.engine.dispose()


def submit_retrying(urls: list[str], token: str, ids: range, acked: dict, stop) -> None:
    """A client as users write one: a refused or cut-off submit is sent again with the
    same idempotency key (to the next replica, if its replica is gone) until the service
    acknowledges it, or the load stops."""
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        for i in ids:
            while not stop.is_set():
                try:
                    r = c.post(f"{urls[0]}/api/v1/jobs", json=job_body(i))
                except httpx.TransportError:
                    r = None             # the server died or the database went away
                    urls.append(urls.pop(0))
                if r is not None and r.status_code in (200, 201):
                    acked[f"key-{i}"] = r.json()["id"]
                    break
                assert r is None or r.status_code == 503, r.text
                time.sleep(0.2)


def test_leader_sigkill_and_a_database_restart_under_load_lose_nothing(tmp_path):
    """Two replicas under concurrent clients; the leader is SIGKILLed and then PostgreSQL
    restarts (immediate stop): no acknowledged job is lost, no GPU or core is in two live
    allocations, and the other replica schedules again."""
    from tests.scheduler_core.store.test_hardening_store import Postgres

    pg = Postgres(max_connections=100)
    engine, token, cluster = prepared(pg.url, tmp_path, CLUSTER, "load")
    servers = [Server(pg.url, cluster, args=("--replicas", "2")) for _ in range(2)]
    acked: dict[str, str] = {}
    stop = threading.Event()
    clients = Clients()
    try:
        until(lambda: [s.healthy()["scheduling"] for s in servers].count(True) == 1,
              "one of the two replicas leads")
        leader, other = sorted(servers, key=lambda s: not s.healthy()["scheduling"])
        for k in range(8):
            clients.start(submit_retrying, [servers[k % 2].url, servers[1 - k % 2].url],
                          token, range(k * 1000, k * 1000 + 1000), acked, stop)
        until(lambda: clients.ok() and len(acked) >= 40,
              "the clients' first jobs are acknowledged", 60)
        leader.kill()
        pg.stop()
        time.sleep(1.0)
        pg.start()
        at_restart = len(acked)
        until(lambda: clients.ok() and len(acked) >= at_restart + 40,
              "submits work again after it", 60)
        until(lambda: (other.healthy() or {}).get("scheduling") is True,
              "the other replica leads", 60)
        stop.set()
        clients.join()
        check = make_engine(pg.url)
        jobs = check_store(check)
        assert set(acked.values()) <= set(jobs), "an acknowledged job was lost"
        assert len({j.idempotency_key for j in jobs.values()}) == len(jobs)
        until(lambda: any(j.state == "admitted" for j in check_store(check).values()),
              "the surviving replica admits jobs", 30)
        check.dispose()
    finally:
        stop.set()
        for s in servers:
            s.stop()
        engine.dispose()
        pg.close()
