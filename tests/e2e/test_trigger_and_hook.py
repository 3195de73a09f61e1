"""The connection, the hook and the deferrable AdmissionTrigger against the real
scheduler-core (in this process: the trigger's event loop is the test's)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from airflow_gpu.hooks.scheduler import GpuSchedulerHook, client_options
from airflow_gpu.triggers.admission import AdmissionTrigger
from tests.e2e.conftest import airflow_env


def job(name: str, gpus: int, replicas: int = 1) -> dict:
    return {"name": name, "roles": [{"name": "w", "replicas": replicas, "gpus": gpus,
                                     "cpus": 1, "memory": "64MiB"}]}


@pytest.fixture
def hook(scheduler, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT", scheduler.connection())
    return GpuSchedulerHook()


def first_event(trigger: AdmissionTrigger) -> dict:
    async def run():
        return (await anext(trigger.run())).payload
    return asyncio.run(asyncio.wait_for(run(), 60))


def test_trigger_serializes_and_round_trips():
    t = AdmissionTrigger("abc", "my_conn", 2.5)
    path, kwargs = t.serialize()
    assert path == "airflow_gpu.triggers.admission.AdmissionTrigger"
    assert AdmissionTrigger(**kwargs).serialize() == (path, kwargs)


def test_trigger_waits_for_admission_then_fires_once(scheduler, hook):
    with hook.get_conn() as client:
        blocker = client.submit(job("blocker", 4, replicas=2))        # every GPU
        scheduler.wait_for(lambda: client.job(blocker["id"])["state"] == "admitted")
        waiting = client.submit(job("waiting", 1))
        trigger = AdmissionTrigger(waiting["id"], poll_interval=0.2)

        async def wait_then_free():
            events = trigger.run()
            first = asyncio.ensure_future(anext(events))
            await asyncio.sleep(1.0)
            assert not first.done()                                    # still waiting
            await asyncio.to_thread(client.finish, blocker["id"], "succeeded", 0)
            return (await asyncio.wait_for(first, 30)).payload

        event = asyncio.run(wait_then_free())
    assert event["status"] == "admitted" and event["job_id"] == waiting["id"]
    assert "admitted on host-" in event["message"]


def test_trigger_reports_a_cancelled_job(scheduler, hook):
    with hook.get_conn() as client:
        blocker = client.submit(job("blocker", 4, replicas=2))
        waiting = client.submit(job("waiting", 1))
        client.cancel(waiting["id"])
    assert first_event(AdmissionTrigger(waiting["id"], poll_interval=0.2))["status"] == \
        "cancelled"
    assert blocker["id"]


def test_trigger_on_kill_cancels_the_queued_job(scheduler, hook):
    with hook.get_conn() as client:
        client.submit(job("blocker", 4, replicas=2))
        waiting = client.submit(job("waiting", 1))
        asyncio.run(AdmissionTrigger(waiting["id"]).on_kill())
        assert client.job(waiting["id"])["state"] == "cancelled"


def test_connection_options_tls_and_url():
    from airflow.sdk import Connection

    plain = client_options(Connection(conn_id="a", conn_type="gpu_scheduler", host="gpu-sched",
                                      port=9000, password="tok"))
    assert plain["url"] == "http://gpu-sched:9000" and plain["token"] == "tok"
    tls = client_options(Connection(conn_id="b", conn_type="gpu_scheduler", host="gpu-sched",
                                    extra=json.dumps({"tls": True, "verify": "/ca.pem"})))
    assert tls["url"] == "https://gpu-sched:8080" and tls["verify"] == "/ca.pem"


def test_hook_test_connection_checks_the_token(scheduler, hook, monkeypatch):
    assert hook.test_connection() == (True, "connected to the GPU scheduler")
    bad = json.loads(scheduler.connection()) | {"password": "wrong"}
    monkeypatch.setenv("AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT", json.dumps(bad))
    ok, message = GpuSchedulerHook().test_connection()
    assert not ok and "401" in message


def test_airflow_discovers_the_provider(airflow_home):
    def airflow(*args: str) -> list[dict]:
        out = subprocess.run([sys.executable, "-m", "airflow", "providers", *args, "-o",
                              "json"], env=airflow_env(airflow_home), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    ours = [p for p in airflow("list") if p["package_name"] == "airflow-provider-gpu"]
    assert len(ours) == 1 and ours[0]["version"]
    hooks = [h for h in airflow("hooks") if h["connection_type"] == "gpu_scheduler"]
    assert hooks and hooks[0]["class"] == "airflow_gpu.hooks.scheduler.GpuSchedulerHook"
    assert {"package_name": "airflow-provider-gpu", "class": "airflow_gpu.triggers.admission",
            "integration_name": "GPU scheduler"} in airflow("triggers")


def test_cli_inside_airflow_reads_the_connection(scheduler, hook, airflow_home):
    """No --url/--token and no AIRFLOW_GPU_* variables: the gpu_scheduler connection."""
    with hook.get_conn() as client:
        submitted = client.submit(job("from-airflow", 1))
    env = airflow_env(airflow_home, AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT=scheduler.connection())
    for name in ("AIRFLOW_GPU_URL", "AIRFLOW_GPU_TOKEN"):
        env.pop(name, None)
    # --all: admitted at once, the job is lost (no heartbeat, a 4 s lease) before the
    # command has started
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "queue", "--all", "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [j["id"] for j in json.loads(out.stdout)] == [submitted["id"]]
