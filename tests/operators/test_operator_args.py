"""Operator arguments: a bad GPU request fails when the DAG is parsed, naming the field;
the expected runtime comes from the task's last successful runs (real service)."""

from __future__ import annotations

import time

import pytest
import yaml

from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.operators.docker import GpuDockerOperator
from airflow_gpu.operators.gang import GpuGangOperator
from airflow_gpu.scheduler_core.client import Client
from tests.e2e.conftest import create_token
from tests.servers import Server


def test_bad_requests_name_the_field():
    with pytest.raises(ValueError, match=r"task 't': the GPU request is invalid: roles\[0\]\.gpus: "
                       r"-1 is under the least accepted, 0; give 0 or more$"):
        GpuDockerOperator(task_id="t", image="x", gpus=-1)
    with pytest.raises(ValueError, match=r"roles\[0\]: unknown field 'replicaz'; did you "
                       r"mean 'replicas'\?"):
        GpuGangOperator(task_id="t", image="x", roles=[{"name": "w", "replicaz": 2}])
    with pytest.raises(ValueError, match="placement.locality"):
        GpuBashOperator(task_id="t", bash_command="true", placement={"locality": "planet"})
    with pytest.raises(ValueError, match=r"roles\[ps\]\.image: the docker runner needs"):
        GpuGangOperator(task_id="t", roles=[{"name": "ps", "cpus": 1}])
    with pytest.raises(ValueError, match="runner: 'k8s'"):
        GpuGangOperator(task_id="t", runner="k8s", image="x")
    with pytest.raises(ValueError, match="gpu_mode: 'mig'"):
        GpuDockerOperator(task_id="t", image="x", gpu_mode="mig")


def test_spec_from_arguments():
    op = GpuDockerOperator(task_id="t", image="x", gpus=2, gpu_model="H100",
                           gpu_memory="48GiB", cpus=8, memory="32GiB", job_class="pytorch",
                           priority=7, expected_runtime="2h")
    spec = op._spec("dag.t", "vision")
    # as the service stores it (jobfile.wire): one GPU model is a list of one
    assert spec == {"name": "dag.t", "priority": 7, "team": "vision", "job_class": "pytorch",
                    "expected_runtime": "2h",
                    "roles": [{"name": "main", "gpus": 2, "cpus": 8, "memory": "32GiB",
                               "gpu": {"model": ["H100"], "min_memory": "48GiB"}}]}


@pytest.fixture
def client(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": [
        {"name": "dgx-1", "model": "dgx-a100"}]}))
    server = Server(f"sqlite:///{tmp_path}/db.sqlite", cluster, interval=0.1)
    with Client(server.url, create_token(server.db, "ml")) as c:
        yield c
    server.stop()


def run_job(client: Client, name: str) -> None:
    job = client.submit({"name": name, "roles": [{"name": "w", "gpus": 1}]})
    while client.job(job["id"])["state"] != "admitted":
        time.sleep(0.05)
    client.heartbeat(job["id"])
    client.finish(job["id"], "succeeded", 0)


def test_expected_runtime_from_history(client):
    op = GpuDockerOperator(task_id="t", image="x", gpus=1)
    assert op._runtime(client, "d.t") is None                  # no history: class default
    for _ in range(3):
        run_job(client, "d.t")
    seconds = op._runtime(client, "d.t")
    assert seconds is not None and seconds >= 1
    assert GpuDockerOperator(task_id="t", image="x", expected_runtime="1h")._runtime(
        client, "d.t") is None                               # an explicit value wins
    assert GpuDockerOperator(task_id="t", image="x", gpus=1)._runtime(client, "other") is None


def test_gpu_mode_from_airflow_config(monkeypatch):
    assert GpuDockerOperator(task_id="t", image="x").gpu_mode == "device-request"
    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__DOCKER_GPU_MODE", "env")
    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__DOCKER_RUNTIME", "nvidia")
    op = GpuDockerOperator(task_id="t", image="x")
    assert (op.gpu_mode, op.docker_runtime) == ("env", "nvidia")
    assert GpuDockerOperator(task_id="t", image="x", gpu_mode="cdi").gpu_mode == "cdi"


def test_the_task_log_warns_once_when_the_idle_policy_flags_the_job(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": [
        {"name": "dgx-1", "model": "dgx-a100"}]}))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"idle": {"after": "1s"}}))
    server = Server(f"sqlite:///{tmp_path}/db.sqlite", cluster, interval=0.1,
                    args=("--policy-file", str(policy)))
    try:
        with Client(server.url, create_token(server.db, "ml")) as c, \
                Client(server.url, create_token(server.db, "ops", "--admin")) as admin:
            job = c.submit({"name": "nb", "roles": [{"name": "w", "gpus": 2}]})
            while c.job(job["id"])["state"] != "admitted":
                time.sleep(0.05)
            gpus = c.heartbeat(job["id"])["replicas"][0]["gpus"]
            op = GpuBashOperator(task_id="t", bash_command="true", gpus=2)
            end = time.monotonic() + 30
            while not c.job(job["id"])["idle_flagged_at"] and time.monotonic() < end:
                admin.request("POST", "/api/v1/hosts/dgx-1/report", json={"gpus": [
                    {"index": g, "healthy": True, "utilization_gpu": 0.0} for g in gpus]})
                time.sleep(0.2)
            capsys.readouterr()
            for _ in range(3):
                op._beat(c, job["id"], job["attempt"] + 1)
    finally:
        server.stop()
    out = capsys.readouterr()
    idle = [line for line in (out.out + out.err).splitlines() if "stayed idle" in line]
    assert len(idle) == 1 and f"GPU job {job['id'][:8]}:" in idle[0]


def test_notify_goes_into_the_spec_and_a_bad_one_fails_when_parsed():
    op = GpuBashOperator(task_id="t", bash_command="true", notify="https://hooks.example/x")
    assert op._spec("d.t")["notify"] == {"url": "https://hooks.example/x"}
    op = GpuBashOperator(task_id="t", bash_command="true",
                         notify={"url": "https://hooks.example/x", "events": ["preemption"]})
    assert op._spec("d.t")["notify"]["events"] == ["preemption"]
    with pytest.raises(ValueError, match=r"notify\.events\[0\]: 'done' is not one of 'start', "):
        GpuBashOperator(task_id="t", bash_command="true",
                        notify={"url": "https://hooks.example/x", "events": ["done"]})


def test_the_task_log_names_the_idle_notification_once(tmp_path, capsys):
    from tests.webhooks import Receiver

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": [
        {"name": "dgx-1", "model": "dgx-a100"}]}))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"idle": {"after": "1s"}, "notifications": {
        "allowed_urls": ["http://127.0.0.1:"]}}))
    server = Server(f"sqlite:///{tmp_path}/db.sqlite", cluster, interval=0.1,
                    args=("--policy-file", str(policy)))
    hook = Receiver().start()
    try:
        with Client(server.url, create_token(server.db, "ml")) as c, \
                Client(server.url, create_token(server.db, "ops", "--admin")) as admin:
            admin.set_team("ml", None, None, webhook={"secret": "new"}, shares=False)
            op = GpuBashOperator(task_id="t", bash_command="true", gpus=1,
                                 notify={"url": hook.url, "events": ["idle"]})
            job = c.submit(op._spec("d.t"))
            while c.job(job["id"])["state"] != "admitted":
                time.sleep(0.05)
            gpus = c.heartbeat(job["id"])["replicas"][0]["gpus"]
            end = time.monotonic() + 30
            while not c.job(job["id"])["idle_flagged_at"] and time.monotonic() < end:
                admin.request("POST", "/api/v1/hosts/dgx-1/report", json={"gpus": [
                    {"index": g, "healthy": True, "utilization_gpu": 0.0} for g in gpus]})
                time.sleep(0.2)
            hook.wait(1)
            capsys.readouterr()
            for _ in range(3):
                op._beat(c, job["id"], job["attempt"] + 1)
    finally:
        hook.stop()
        server.stop()
    out = capsys.readouterr()
    told = [line for line in (out.out + out.err).splitlines() if "notification" in line]
    assert len(told) == 1, told
    assert f"idle notification (idle) to {hook.url}, asked by its job: delivered" in told[0]
