"""Leadership that a frozen process cannot keep, replicas that start together on a fresh
database, and submits that a lost answer does not duplicate.

- A leader frozen (SIGSTOP) keeps its advisory lock but not its lease: another replica
  takes over once the lease expires and schedules; the old one, woken, never writes
  again (each pass's transaction first locks the lease row with the leader's fencing
  token). In process too, with the leader frozen in the middle of its pass.
- Migrations run under an advisory lock: servers started at once on an empty schema all
  come up.
- The client retries a submit whose answer was lost with the same idempotency key: one job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml
from sqlalchemy import func, select, text

from airflow_gpu import cli
from airflow_gpu.scheduler_core.client import Client
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.service import storepass, warm
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.service.core import Principal, Service, Settings
from airflow_gpu.scheduler_core.service.leadership import NotLeader
from airflow_gpu.scheduler_core.service.loop import SchedulerLoop
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from airflow_gpu.scheduler_core.store.models import (
    AllocationRow,
    CpuHoldRow,
    EventRow,
    GpuHoldRow,
    JobRow,
    LeaderLeaseRow,
)
from tests.databases import HOSTS, _drop_pg_schema, _pg_schema_url
from tests.helpers import make_cluster, until
from tests.servers import Server, prepared

LEASE = 2.0     # seconds: the servers' leader lease here


def spec(name: str, gpus: int = 1) -> dict:
    return {"name": name, "expected_runtime": "1h", "roles": [{"name": "w", "gpus": gpus}]}



@pytest.fixture
def pg(tmp_path):
    """A fresh PostgreSQL schema with its tables and a token, and a cluster file."""
    schema, url = _pg_schema_url()
    engine, token, cluster = prepared(url, tmp_path, {"cluster": "lead", "hosts": list(HOSTS)},
                                      "vision")
    try:
        yield {"url": url, "engine": engine, "token": token, "cluster": cluster,
               "tmp": tmp_path}
    finally:
        engine.dispose()
        _drop_pg_schema(schema)


def check_no_double_grant(engine, jobs: list[str]) -> None:
    """Every job admitted once, by one pass: attempt 1, one "admitted" event, its holds
    those of its allocations; no GPU or core in two live allocations."""
    with sessions(engine)() as s:
        rows = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(jobs)))}
        assert sorted(rows) == sorted(jobs)
        for j in rows.values():
            assert (j.state, j.attempt) == ("admitted", 1), (j.id, j.state, j.attempt)
        admitted = dict(s.execute(select(EventRow.job_id, func.count()).where(
            EventRow.kind == "admitted").group_by(EventRow.job_id)).all())
        assert all(admitted.get(j) == 1 for j in jobs), admitted
        allocs = list(s.scalars(select(AllocationRow).where(AllocationRow.live.is_(True))))
        assert sorted(a.job_id for a in allocs) == sorted(jobs)      # one replica each
        gpus = [(a.host, g) for a in allocs for g in a.gpus]
        cpus = [(a.host, c) for a in allocs for c in a.cpus]
        assert len(gpus) == len(set(gpus)) == len(jobs)
        assert len(cpus) == len(set(cpus))
        assert sorted(gpus) == sorted((h.host, h.gpu) for h in s.scalars(select(GpuHoldRow)))
        assert sorted(cpus) == sorted((h.host, h.cpu) for h in s.scalars(select(CpuHoldRow)))


# -- a frozen leader: real processes -------------------------------------------------------

def test_a_sigstopped_leader_is_replaced_within_its_lease_and_never_writes_again(
        pg, monkeypatch):
    monkeypatch.setenv("AIRFLOW_GPU_LEADER_LEASE", str(LEASE))
    # info: a takeover of a lock the database freed is logged at info ("schedules now")
    servers = [Server(pg["url"], pg["cluster"], lease_ttl=600, log=pg["tmp"] / f"s{i}.log",
                      args=("--log-level", "info")) for i in range(2)]
    headers = {"Authorization": f"Bearer {pg['token']}"}

    def submit(server: Server, name: str) -> str:
        r = httpx.post(f"{server.url}/api/v1/jobs", json={"spec": spec(name)},
                       headers=headers, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def admitted(server: Server, ids: list[str]) -> bool:
        return all(httpx.get(f"{server.url}/api/v1/jobs/{i}", headers=headers, timeout=5)
                   .json()["state"] == "admitted" for i in ids)

    try:
        until(lambda: [s.healthy()["scheduling"] for s in servers].count(True) == 1,
              "one replica schedules")
        jobs = [submit(servers[0], "first")]
        until(lambda: admitted(servers[0], jobs), "the leader admits")
        for rnd in range(3):          # each round freezes whichever replica leads
            leader, other = (servers if servers[0].healthy()["scheduling"]
                             else servers[::-1])
            os.kill(leader.proc.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                new = [submit(other, f"while-frozen-{rnd}-{i}") for i in range(2)]
                until(lambda o=other, n=new: admitted(o, n), "the other replica takes over and "
                      "admits", timeout=LEASE + 15)
                took = time.monotonic() - frozen_at
                # the lease (renewed up to a round before the freeze), then a round or two
                assert took < LEASE + 3, f"took over after {took:.1f}s"
                h = other.healthy()
                assert h["scheduling"] is True and h["leader"]["this_replica"] is True
                assert h["warning"] is None
            finally:
                os.kill(leader.proc.pid, signal.SIGCONT)
            jobs += new
            # woken, the old leader finds its token stale and stops: it names the new one
            h = until(lambda x=leader: (h := x.healthy()) and h["scheduling"] is False
                      and h["leader"] and h, "the woken leader steps down")
            assert h["leader"]["pid"] == other.healthy()["leader"]["pid"]
            later = [submit(leader, f"after-wake-{rnd}")]   # its API still serves
            until(lambda x=leader, n=later: admitted(x, n), "admitted by the new leader")
            jobs += later
            assert not leader.healthy()["scheduling"]
            # the frozen leader's lock connection was idle (it keeps the lock: a takeover
            # of the expired lease; woken, it reads that) or inside a renewal (the database
            # ended it after the lease: the lock freed, taken normally; woken, its renewal
            # finds the connection gone and changes nothing)
            woke = leader.log.read_text()
            # (or it was inside a pass: that pass finds its token stale and writes nothing;
            # or its lock's connection was ended while it was between rounds: it stops)
            assert ("another replica took the scheduler lease over" in woke
                    or "the scheduler lock's connection failed; this replica stops "
                    "scheduling" in woke
                    or "the database cannot be reached" in woke
                    and "nothing was changed" in woke
                    or "was taken over or ran out; this replica stops scheduling and its "
                    "pass wrote nothing" in woke), woke
            took_over = other.log.read_text()
            assert ("expired while it still holds advisory lock key" in took_over
                    or "this replica schedules now" in took_over)
        time.sleep(1)                 # a few more rounds of both: nothing else happens
        check_no_double_grant(pg["engine"], jobs)
        with sessions(pg["engine"])() as s:
            lease = s.scalars(select(LeaderLeaseRow)).one()
        # one election at start, then one takeover per freeze (a woken leader takes
        # nothing back: the lock it frees goes to the lease's holder)
        assert lease.token == 4, lease.token
        assert [s.healthy()["scheduling"] for s in servers].count(True) == 1
    finally:
        for s in servers:
            if s.proc.poll() is None:
                os.kill(s.proc.pid, signal.SIGCONT)
            s.stop()


# -- a leader frozen in the middle of its pass: in process -----------------------------------

def test_a_leader_frozen_mid_pass_is_taken_over_and_its_pass_writes_nothing(pg, monkeypatch):
    """The leader stops right after its pass's fence (its transaction holds the lease row
    and is idle): the database ends that transaction after the lease, the other replica
    takes over and admits; the old pass, resumed, commits nothing."""
    monkeypatch.setenv("AIRFLOW_GPU_LEADER_LEASE", "1")
    services = [Service(Settings(pg["url"], make_cluster(*HOSTS), lease_ttl=600))
                for _ in range(2)]
    a, b = (SchedulerLoop(s) for s in services)
    assert a.lease == 1.0
    frozen, thaw = threading.Event(), threading.Event()
    real = storepass.handle_gpu_faults

    def freeze_a(svc, s, now, **kw):
        if svc is services[0]:
            frozen.set()
            thaw.wait(30)                    # as SIGSTOP, after the fence
        return real(svc, s, now, **kw)

    monkeypatch.setattr(storepass, "handle_gpu_faults", freeze_a)
    renew = a._renew

    def frozen_renew():                      # SIGSTOP freezes the lease keeper too
        if frozen.is_set():
            thaw.wait(30)
        return renew()

    monkeypatch.setattr(a, "_renew", frozen_renew)
    outcome: dict = {}

    def a_tick():
        try:
            outcome["admitted"] = a.tick()
        except Exception as exc:
            outcome["error"] = exc

    try:
        assert a._lead() and a.token == 1
        assert not b._lead() and b.holder["pid"] == a.lock_pid
        row, _ = services[0].submit(JobSpec.model_validate(spec("one")), Principal("vision"))
        t = threading.Thread(target=a_tick)
        t.start()
        assert frozen.wait(10)
        start = time.monotonic()
        until(lambda: b._lead(), "b takes over the lease", timeout=15)
        assert b.token == 2 and not b.has_lock            # a still holds the lock
        assert time.monotonic() - start < 5
        assert b.tick() == [row.id]
        thaw.set()
        t.join(10)
        assert "admitted" not in outcome and outcome["error"] is not None
        assert not a._lead() and not a.leader and a.token is None    # stale: steps down
        with pytest.raises(NotLeader):
            a.tick()                                    # a pass by hand writes nothing
        assert not a._lead() and a.holder["pid"] == b.lock_pid
        until(lambda: b._lead() and b.has_lock, "the lock freed, b takes it", timeout=5)
        check_no_double_grant(pg["engine"], [row.id])
    finally:
        thaw.set()
        for loop in (a, b):
            loop.stop()
        for s in services:
            s.engine.dispose()


def test_a_lease_run_out_fences_the_pass(pg):
    """Between passes: a leader whose lease was taken over writes nothing, at once."""
    services = [Service(Settings(pg["url"], make_cluster(*HOSTS), lease_ttl=600))
                for _ in range(2)]
    a, b = (SchedulerLoop(s) for s in services)
    try:
        assert a._lead() and not b._lead()
        row, _ = services[0].submit(JobSpec.model_validate(spec("one")), Principal("vision"))
        with pg["engine"].begin() as conn:                 # as if a was frozen for long
            conn.execute(text("UPDATE leader_lease SET expires_at = now() - interval '1s'"))
        assert b._lead() and b.token == a.token + 1
        with pytest.raises(NotLeader, match="taken over or ran out"):
            a.tick()
        assert b.tick() == [row.id]
        check_no_double_grant(pg["engine"], [row.id])
    finally:
        for loop in (a, b):
            loop.stop()
        for s in services:
            s.engine.dispose()


def test_a_pass_deciding_for_longer_than_the_lease_keeps_it_and_admits(pg, monkeypatch):
    """A pass that decides for three leases (a cold read of a long queue) renews its
    lease meanwhile: it admits, and the other replica never takes over."""
    monkeypatch.setenv("AIRFLOW_GPU_LEADER_LEASE", "1")
    services = [Service(Settings(pg["url"], make_cluster(*HOSTS), lease_ttl=600))
                for _ in range(2)]
    a, b = (SchedulerLoop(s) for s in services)
    real = warm.read

    def slow_read(svc, *args):
        if svc is services[0]:
            time.sleep(3.0)
        return real(svc, *args)

    monkeypatch.setattr(warm, "read", slow_read)
    tried = threading.Event()

    def b_tries():
        while not tried.is_set():
            assert not b._lead()        # the lease never runs out while a decides
            tried.wait(0.2)

    try:
        assert a._lead()
        row, _ = services[0].submit(JobSpec.model_validate(spec("one")), Principal("vision"))
        t = threading.Thread(target=b_tries)
        t.start()
        try:
            assert a.tick() == [row.id]
        finally:
            tried.set()
            t.join(10)
        assert a.token == 1 and a._lead()
        check_no_double_grant(pg["engine"], [row.id])
    finally:
        for loop in (a, b):
            loop.stop()
        for s in services:
            s.engine.dispose()


# -- point 10: replicas starting together on a fresh database ------------------------------

@pytest.mark.parametrize("trial", range(5))
def test_replicas_started_together_on_a_fresh_database_all_come_up(tmp_path, trial):
    schema, url = _pg_schema_url()                  # empty: no tables yet
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "fresh", "hosts": list(HOSTS)}))
    servers: list[Server] = []

    def start(i: int) -> Server:
        s = Server(url, cluster, log=tmp_path / f"s{i}.log")
        servers.append(s)
        return s

    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(start, range(3)))       # raises if one did not come up
        until(lambda: [s.healthy()["scheduling"] for s in servers].count(True) == 1,
              "one of them schedules")
        for s in servers:
            assert s.proc.poll() is None
            assert "Traceback" not in s.log.read_text()
    finally:
        for s in servers:
            s.stop()
        _drop_pg_schema(schema)


# -- a submit whose answer is lost --------------------------------------------------------

class DropFirstAnswers:
    """A loopback TCP proxy to `port` that forwards each request whole but, for the first
    `drops` connections, closes the client's side once the server has answered, without
    passing the answer on (as a timeout or a broken connection would lose it)."""

    def __init__(self, port: int, drops: int = 1):
        self.port, self.drops, self.dropped = port, drops, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            drop = self.drops > 0
            self.drops -= drop
            upstream = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pipe, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, drop),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, drop: bool) -> None:
        try:
            while data := src.recv(65536):
                if drop:              # the server answered: the job exists; lose it
                    self.dropped += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def served(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = make_engine(url)
    upgrade(engine)
    token = create_token(sessions(engine), "vision")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "idem", "hosts": list(HOSTS)}))
    server = Server(url, cluster)
    try:
        yield server, token, engine
    finally:
        server.stop()
        engine.dispose()


def _named(engine, name: str) -> int:
    with sessions(engine)() as s:
        return s.scalar(select(func.count()).select_from(JobRow).where(JobRow.name == name))


def test_a_submit_whose_answer_is_lost_is_retried_with_its_key_and_creates_one_job(served):
    server, token, engine = served
    proxy = DropFirstAnswers(server.port)
    try:
        with Client(proxy.url, token, timeout=10) as c:
            job = c.submit(spec("lost-answer"))
        assert proxy.dropped == 1
        assert _named(engine, "lost-answer") == 1
        assert job["idempotency_key"]                    # the client made one up
        with sessions(engine)() as s:
            assert s.get(JobRow, job["id"]).idempotency_key == job["idempotency_key"]
    finally:
        proxy.close()


def test_a_submit_that_times_out_is_retried_with_its_key_and_creates_one_job(served):
    """The answer comes after the client's timeout (the server is slow): one job."""
    server, token, engine = served
    proxy = DropFirstAnswers(server.port, drops=0)
    os.kill(server.proc.pid, signal.SIGSTOP)           # the server hangs for a while
    def wake() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.proc.pid, signal.SIGCONT)

    threading.Timer(1.5, wake).start()
    try:
        with Client(proxy.url, token, timeout=1.0) as c:
            job = c.submit(spec("slow-answer"), retries=(0.5, 1, 2, 4))
        assert job["name"] == "slow-answer"
        assert _named(engine, "slow-answer") == 1
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        proxy.close()


def test_the_cli_sends_a_key_per_job_and_a_retry_creates_no_duplicate(served, tmp_path,
                                                                      capsys):
    server, token, engine = served
    proxy = DropFirstAnswers(server.port, drops=2)
    file = tmp_path / "jobs.yaml"
    file.write_text(yaml.safe_dump({"jobs": [spec("cli-a"), spec("cli-b")]}))
    try:
        assert cli.main(["submit", str(file), "--url", proxy.url, "--token", token]) == 0
        ids = capsys.readouterr().out.split()
        assert proxy.dropped == 2 and len(ids) == 2
        assert (_named(engine, "cli-a"), _named(engine, "cli-b")) == (1, 1)
        with sessions(engine)() as s:
            keys = [s.get(JobRow, i).idempotency_key for i in ids]
        assert all(keys) and keys[0] != keys[1]
        # a second invocation is new jobs (new keys)
        assert cli.main(["submit", str(file), "--url", server.url, "--token", token]) == 0
        assert _named(engine, "cli-a") == 2
    finally:
        proxy.close()
