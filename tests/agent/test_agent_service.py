"""Node agents (on fake hosts) against a real service on loopback, on SQLite and
PostgreSQL: hosts the cluster file does not list join the cluster; a hardware XID or a
double-bit ECC error makes a GPU unhealthy within one heartbeat, the engine places nothing
more on it and the gang running on it is requeued; an application XID changes nothing; a
silent host turns unreachable and comes back when it reports."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import yaml

from airflow_gpu.agent.config import AgentConfig
from airflow_gpu.agent.run import Agent
from airflow_gpu.agent.source import NvmlSource
from airflow_gpu.scheduler_core.client import ApiError, Client
from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.servers import Server

DEADLINE = 60.0      # seconds a condition may take to hold; never asserted as a duration


def until(what, message: str, deadline: float = DEADLINE):
    """Poll `what()` until it returns something true; fail with `message` past the deadline."""
    end = time.monotonic() + deadline
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < end, message
        time.sleep(0.05)


class Stack:
    """A server, an admin client (what agents use) and a team client (a launcher)."""

    def __init__(self, db_url: str, tmp_path, host_timeout: float = 60.0):
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": [
            {"name": "file-01", "model": "dgx-a100", "rack": "r1", "switch": "s1"}]}))
        engine = make_engine(db_url)
        upgrade(engine)
        self.admin_token = create_token(sessions(engine), "ops", admin=True)
        self.team_token = create_token(sessions(engine), "vision")
        engine.dispose()
        self.server = Server(db_url, cluster, log=tmp_path / "server.log",
                             args=("--host-timeout", str(host_timeout)))
        self.admin = Client(self.server.url, self.admin_token)
        self.team = Client(self.server.url, self.team_token)
        self.sources: list[NvmlSource] = []
        self.clients: list[Client] = []

    def agent(self, host, name: str, token: str | None = None, **config) -> Agent:
        """An agent of host `name`, with the admin token unless given `token`."""
        src = NvmlSource(host.nvml, host.sysfs, host.procfs, name)
        self.sources.append(src)
        cfg = AgentConfig(server=self.server.url, token=token or self.admin_token, name=name,
                          rack="r1", switch="s1", **config)
        if token is None:
            return Agent(cfg, src, self.admin)
        self.clients.append(Client(self.server.url, token))
        return Agent(cfg, src, self.clients[-1])

    def agent_token(self, *hosts: str, new: tuple[str, ...] = ()) -> str:
        """A node agent's token for `hosts` (as `airflow-gpu token create --agent`), which
        may add the hosts `new` (--allow-new-hosts) the cluster file does not list."""
        engine = make_engine(self.server.db)
        try:
            return create_token(sessions(engine), None, hosts=list(hosts),
                                new_hosts=list(new) or None)
        finally:
            engine.dispose()

    def host(self, name: str) -> dict:
        return next(h for h in self.admin.cluster()["hosts"] if h["name"] == name)

    def close(self) -> None:
        for src in self.sources:
            src.close()
        for c in self.clients:
            c.close()
        self.admin.close()
        self.team.close()
        self.server.stop()


@pytest.fixture
def stack(db_url, tmp_path):
    made = []

    def make(**kw) -> Stack:
        made.append(Stack(db_url, tmp_path, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def h100_job(name: str, replicas: int, job_class: str = "pytorch") -> dict:
    return {"name": name, "job_class": job_class, "expected_runtime": "1h",
            "roles": [{"name": "worker", "replicas": replicas, "gpus": 8, "cpus": 8,
                       "memory": "16GiB", "gpu": {"model": "H100"}}]}


def running(stack: Stack, spec: dict) -> dict:
    job = stack.team.submit(spec)
    until(lambda: stack.team.job(job["id"])["state"] == "admitted", f"{spec['name']} admitted")
    return stack.team.heartbeat(job["id"])         # the launcher: running


def test_agents_register_hosts_the_cluster_file_does_not_list(stack, fake_host):
    s = stack()
    a1 = s.agent(fake_host("dgx-h100"), "agent-01")
    host = a1.register()
    assert (host["name"], host["model"], host["rack"], host["switch"]) == (
        "agent-01", "dgx-h100", "r1", "s1")
    assert host["agent"] and host["reachable"] and len(host["gpus"]) == 8
    job = running(s, h100_job("only-fits-there", 1))
    assert {r["host"] for r in job["replicas"]} == {"agent-01"}
    assert job["replicas"][0]["nics"]            # compute NICs from the discovered model
    view = s.admin.cluster()
    assert [h["name"] for h in view["hosts"]] == ["file-01", "agent-01"]
    assert view["hosts"][0]["agent"] is False and view["hosts"][0]["reachable"] is True


@pytest.mark.parametrize("fault", ["xid79", "double-bit-ecc"])
def test_a_gpu_fault_requeues_the_gang_and_keeps_work_off_the_gpu(stack, fake_host, fault):
    s = stack()
    hosts = {name: fake_host("dgx-h100") for name in ("agent-01", "agent-02")}
    agents = {name: s.agent(h, name) for name, h in hosts.items()}
    for a in agents.values():
        a.register()
        a.report()
    gang = running(s, h100_job("gang", 2))
    assert {r["host"] for r in gang["replicas"]} == {"agent-01", "agent-02"}

    fake = hosts["agent-01"].nvml
    if fault == "xid79":
        fake.inject_xid(3, 79)
    else:
        fake.inject_double_bit_ecc(3)
    src = agents["agent-01"].source
    assert src.wait(0) is True          # the agent heartbeats at once
    agents["agent-01"].report()         # ... this heartbeat

    gpu3 = s.host("agent-01")["gpus"][3]
    assert gpu3["healthy"] is False
    assert ("XID 79" if fault == "xid79" else "double-bit ECC") in gpu3["health_reason"]
    job = s.team.job(gang["id"])
    assert job["state"] == "pending" and job["id"] == gang["id"]
    assert job["replicas"] and not any(r["live"] for r in job["replicas"])
    assert "agent-01:3" in job["gpu_fault"]
    events = s.team.explain(gang["id"])["events"]
    requeued = [e for e in events if e["kind"] == "requeued"]
    assert len(requeued) == 1 and "agent-01:3" in requeued[0]["message"]
    # 15 healthy H100s: the gang of 16 waits (on PostgreSQL a pass that read the GPU's
    # health before the report committed and the jobs after it may place it once more;
    # the next pass's fault check takes it back); an 8-GPU job can only use agent-02
    why = until(lambda: (j := s.team.job(gang["id"]))["state"] == "pending"
                and j["pending"]["code"], "gang explained")
    assert why in ("Unhealthy", "Resources")
    with pytest.raises(ApiError) as err:
        s.team.heartbeat(gang["id"])
    assert err.value.status == 409 and "is pending" in str(err.value)
    assert s.admin.cluster()["gpus_allocated"] == 0        # the whole gang's holds are gone
    eight = running(s, h100_job("eight", 1, job_class="validation"))
    assert [r["host"] for r in eight["replicas"]] == ["agent-02"]


def test_an_application_xid_changes_nothing(stack, fake_host):
    s = stack()
    host = fake_host("dgx-h100")
    a = s.agent(host, "agent-01")
    a.register()
    job = running(s, h100_job("j", 1))
    host.nvml.inject_xid(3, 13)
    assert a.source.wait(0) is False
    a.report()
    assert all(g["healthy"] for g in s.host("agent-01")["gpus"])
    got = s.team.job(job["id"])
    assert got["state"] == "running" and got["gpu_fault"] is None
    assert s.team.heartbeat(job["id"])["state"] == "running"


def test_the_agent_loop_reports_a_fault_as_it_happens(stack, fake_host):
    """With heartbeats an hour apart, only the event can bring the fault in."""
    s = stack()
    host = fake_host("dgx-a100")
    a = s.agent(host, "agent-01", interval=3600)
    stop = threading.Event()
    loop = threading.Thread(target=a.run, args=(stop,), daemon=True)
    loop.start()
    try:
        until(lambda: any(h["name"] == "agent-01" for h in s.admin.cluster()["hosts"]),
              "the agent registered")
        host.nvml.inject_xid(6, 48)
        until(lambda: not s.host("agent-01")["gpus"][6]["healthy"], "GPU 6 unhealthy")
        assert s.host("agent-01")["gpus"][6]["health_reason"] == "XID 48 (double-bit ECC error)"
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()


def test_a_silent_host_turns_unreachable_and_comes_back(stack, fake_host):
    s = stack(host_timeout=1)
    a = s.agent(fake_host("dgx-h100"), "agent-01", interval=0.2)
    a.register()
    a.report()
    until(lambda: not s.host("agent-01")["reachable"], "agent-01 unreachable")
    assert s.host("file-01")["reachable"]          # never had an agent: never unreachable
    waiting = s.team.submit(h100_job("waits", 1))
    until(lambda: (s.team.job(waiting["id"]).get("pending") or {}).get("code"),
          "the job was explained")
    assert s.team.job(waiting["id"])["state"] == "pending"
    stop = threading.Event()          # the agent heartbeats again
    loop = threading.Thread(target=a.run, args=(stop,), daemon=True)
    loop.start()
    try:
        until(lambda: s.host("agent-01")["reachable"], "agent-01 reachable again")
        until(lambda: s.team.job(waiting["id"])["state"] == "admitted", "admitted once back")
    finally:
        stop.set()
        loop.join(timeout=10)


def test_an_agent_refused_while_jobs_run_keeps_trying_until_the_host_is_empty(
        stack, fake_host, caplog):
    """The host comes back as another model (a DGX-1V) while an H100 job runs on it: the
    service refuses (409), the agent says why and keeps trying, and the new model is taken
    once the job has ended."""
    s = stack()
    s.agent(fake_host("dgx-h100"), "agent-01").register()
    job = running(s, h100_job("on-h100", 1))
    again = s.agent(fake_host("dgx-1v"), "agent-01", interval=0.2)
    stop = threading.Event()
    loop = threading.Thread(target=again.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.ERROR, logger="airflow_gpu.agent.run"):
        loop.start()
        try:
            refused = until(lambda: [r.getMessage() for r in caplog.records
                                     if "refused to register agent-01" in r.getMessage()],
                            "the refusal was logged")
            assert "409" in refused[0] and job["id"] in refused[0]
            assert "drain the host (airflow-gpu drain agent-01)" in refused[0]
            assert "trying again every 0.2s" in refused[0]
            until(lambda: len([r for r in caplog.records
                               if "refused to register" in r.getMessage()]) >= 2,
                  "the agent tried again")
            assert loop.is_alive() and not again.registered
            assert s.host("agent-01")["model"] == "dgx-h100"
            s.team.finish(job["id"], "succeeded")
            until(lambda: s.host("agent-01")["model"] == "dgx-1v",
                  "the new model was taken once the host was empty")
            until(lambda: again.registered, "the agent registered")
        finally:
            stop.set()
            loop.join(timeout=10)
    assert not loop.is_alive()


def test_an_agent_with_an_agent_token_serves_its_host_and_nothing_else(stack, fake_host):
    """The recommended setup: each agent with a token for its own host only. The loop
    registers and heartbeats (a fault arrives); the same token cannot act for another host,
    nor on jobs, teams or admin routes."""
    s = stack()
    token = s.agent_token("agent-01", new=("agent-01",))    # not in the cluster file
    host = fake_host("dgx-h100")
    a = s.agent(host, "agent-01", token=token, interval=3600)
    stop = threading.Event()
    loop = threading.Thread(target=a.run, args=(stop,), daemon=True)
    loop.start()
    try:
        until(lambda: any(h["name"] == "agent-01" for h in s.admin.cluster()["hosts"]),
              "the agent registered with its agent token")
        host.nvml.inject_xid(2, 79)
        until(lambda: not s.host("agent-01")["gpus"][2]["healthy"], "GPU 2 unhealthy")
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()

    other = s.agent(fake_host("dgx-a100"), "agent-02", token=token)
    with pytest.raises(InputError) as err:
        other.run(once=True)
    assert "403" in str(err.value) and "agent token" in str(err.value)
    assert "airflow-gpu token create --agent --host agent-02" in str(err.value)
    assert "agent-02" not in [h["name"] for h in s.admin.cluster()["hosts"]]

    job = s.team.submit(h100_job("theirs", 1))
    as_agent = s.clients[0]
    for call in (as_agent.cluster, lambda: as_agent.cancel(job["id"]),
                 lambda: as_agent.drain("file-01")):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == 403 and "role agent" in str(refused.value)
    assert s.team.job(job["id"])["state"] != "cancelled"
