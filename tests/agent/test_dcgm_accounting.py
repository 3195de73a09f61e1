"""Accounting end to end: `airflow-gpu server` in its own process, a node agent in
declared mode fed by the dcgm-exporter stand-in, a launcher heartbeating two jobs. What
`airflow-gpu acct --json` reports equals the integral of the samples the stand-in served
(within one sample interval); the job whose GPUs stay idle is flagged and, with the idle
policy's requeue action, stopped and requeued under the same id."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from airflow_gpu.agent.config import AgentConfig
from airflow_gpu.agent.run import Agent
from airflow_gpu.agent.telemetry import make_source
from airflow_gpu.scheduler_core.client import Client
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from tests.agent.dcgmexporter import DcgmExporterStub
from tests.agent.test_agent_service import until
from tests.cli.test_cli_e2e import cli
from tests.servers import Server

STEP = 0.3           # seconds between two heartbeats (the sample interval)
STEPS = 12
UTIL = "DCGM_FI_DEV_GPU_UTIL"


def trapezoids(times: list[float], values: list[float]) -> float:
    return sum((values[i] + values[i - 1]) / 2 * (times[i] - times[i - 1])
               for i in range(1, len(times)))


@pytest.fixture
def stack(db_url, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": []}))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"idle": {"after": "1s", "threshold": 5,
                                               "action": "requeue", "grace": "1s"}}))
    engine = make_engine(db_url)
    upgrade(engine)
    admin = create_token(sessions(engine), "ops", admin=True)
    team = create_token(sessions(engine), "vision")
    engine.dispose()
    server = Server(db_url, cluster, log=tmp_path / "server.log",
                    args=("--policy-file", str(policy)))
    with DcgmExporterStub() as stub, Client(server.url, admin) as a, \
            Client(server.url, team) as t:
        config = AgentConfig(server=server.url, token=admin, name="dgx-a-01", rack="r1",
                             switch="s1", declared="dgx-a100", dcgm_exporter=stub.url)
        source = make_source(config)
        try:
            yield {"agent": Agent(config, source, a), "team": t, "stub": stub,
                   "env": {"AIRFLOW_GPU_URL": server.url, "AIRFLOW_GPU_TOKEN": team}}
        finally:
            source.close()
            server.stop()


def test_acct_equals_the_integral_of_the_fed_samples_and_an_idle_job_is_requeued(stack):
    agent, team, stub = stack["agent"], stack["team"], stack["stub"]
    agent.register()
    jobs = {}
    for name in ("train", "notebook"):
        j = team.submit({"name": name, "expected_runtime": "2h",
                         "roles": [{"name": "w", "gpus": 4}]})
        until(lambda j=j: team.job(j["id"])["state"] == "admitted", f"{name} admitted")
        jobs[name] = team.heartbeat(j["id"])
    train = jobs["train"]["replicas"][0]["gpus"]
    notebook = jobs["notebook"]["replicas"][0]["gpus"]
    for g in notebook:
        stub.set(g, UTIL, 0)
    utils = [10 * (k % 10) + 5 for k in range(STEPS)]
    powers = [100.0 + 20 * k for k in range(STEPS)]
    times = []
    for k in range(STEPS):
        for g in train:
            stub.set(g, UTIL, utils[k])
            stub.set(g, "DCGM_FI_DEV_POWER_USAGE", powers[k])
            stub.set(g, "DCGM_FI_DEV_FB_USED", 1000 + 100 * k)           # MiB
            stub.set(g, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 9_000_000 + 150_000 * k)  # mJ
        before = time.time()
        agent.report()
        times.append((before + time.time()) / 2)
        team.heartbeat(jobs["train"]["id"])
        time.sleep(STEP)

    out = cli("acct", "--json", "--job", jobs["train"]["id"], env=stack["env"])
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["rows"]
    n, span = len(train), times[-1] - times[0]
    assert row["sampled_gpu_seconds"] == pytest.approx(span * n, abs=STEP * n)
    fed = trapezoids(times, utils) * n                        # percent x GPU-seconds
    got = row["utilization_mean"] * row["sampled_gpu_seconds"]
    assert got == pytest.approx(fed, abs=STEP * max(utils) * n)
    assert row["utilization_peak"] == max(utils)
    assert row["memory_peak_bytes"] == (1000 + 100 * (STEPS - 1)) * 2**20
    assert row["energy_joules"] == pytest.approx(150.0 * (STEPS - 1) * n)  # the counter
    assert row["zero_utilization_seconds"] == 0
    assert row["gpus"] == n and row["gpu_seconds"] >= span * n
    assert [r["gpus"] for r in row["replicas"]] == [train]
    table = cli("acct", "--by", "team", env=stack["env"])
    assert table.returncode == 0 and "vision" in table.stdout and "GPU-h" in table.stdout
    csv = cli("acct", "--csv", env=stack["env"]).stdout.splitlines()
    assert csv[0].startswith("job,name,team,state") and len(csv) == 3

    nb = team.job(jobs["notebook"]["id"])
    assert nb["state"] == "preempting" and nb["preempted_by"] is None
    assert nb["idle_flagged_at"] and nb["preempt_reason"].startswith("idle:")
    assert team.job(jobs["train"]["id"])["idle_flagged_at"] is None
    team.finish(nb["id"], "preempted", None, nb["attempt"])    # the launcher stopped it
    nb = team.job(nb["id"])
    # requeued; the service's loop may have admitted it again already (nothing else waits)
    assert nb["state"] in ("pending", "admitted") and nb["requeue_reason"] == "idle", nb
    events = [e["message"] for e in team.explain(nb["id"])["events"]]
    assert any("under 5 % utilization" in m for m in events)


def test_acct_refuses_a_window_it_cannot_read(stack):
    out = cli("acct", "--since", "last tuesday", env=stack["env"])
    assert out.returncode == 2
    assert "--since: 'last tuesday' is neither a date" in out.stderr
