"""What a task does while it waits on the scheduler: the job id's XCom is pushed during
the admission and the start's confirmation, the runtime history is read during the
cluster's, and no cluster is read where every host is this machine."""

from __future__ import annotations

import threading

import pytest

from airflow_gpu.operators.bash import GpuBashOperator


class Client:
    def __init__(self):
        self.calls: list[str] = []
        self.finished: list[tuple] = []

    def jobs(self, **_):
        self.calls.append("jobs")
        return []

    def cluster(self):
        self.calls.append("cluster")
        return {"cluster": "c", "hosts": [{"name": "host-1"}, {"name": "host-2"}]}

    def submit(self, spec, key):
        self.calls.append("submit")
        self.spec = spec
        return {"id": "j1", "state": "pending"}

    def wait(self, job_id, state, timeout):
        self.calls.append("wait")
        return {"id": job_id, "state": "admitted", "attempt": 1}

    def heartbeat(self, job_id, attempt=None):
        self.calls.append("heartbeat")
        return {"id": job_id, "state": "running", "attempt": 1}

    def finish(self, job_id, outcome, code, attempt):
        self.finished.append((job_id, outcome, code, attempt))

    def close(self):
        pass


class Conn:
    extra_dejson: dict = {}


class TaskInstance:
    dag_id, task_id, run_id, map_index, try_number = "d", "t", "r", -1, 1

    def __init__(self, fails: bool = False):
        self.fails, self.pushed, self.thread = fails, {}, None

    def xcom_push(self, key, value):
        self.thread = threading.current_thread()
        if self.fails:
            raise RuntimeError("the XCom could not be stored")
        self.pushed[key] = value


def operator(client: Client) -> GpuBashOperator:
    op = GpuBashOperator(task_id="t", bash_command="true", gpus=1)
    op._client, op._connection = client, Conn()
    return op


def test_no_cluster_is_read_where_every_host_is_this_machine(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", "*")
    client = Client()
    assert operator(client)._runtime_and_host(client, "d.t") == (None, None)
    assert client.calls == ["jobs"]


def test_a_named_worker_host_reads_the_cluster_and_the_history(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", "host-2")
    client = Client()
    assert operator(client)._runtime_and_host(client, "d.t") == (None, "host-2")
    assert sorted(client.calls) == ["cluster", "jobs"]


def test_the_job_id_is_pushed_on_a_thread_before_the_replicas_start(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", "*")
    client, ti = Client(), TaskInstance()
    op = operator(client)
    monkeypatch.setattr(op, "_run", lambda context, job: (dict(ti.pushed), job["state"]))
    assert op._submit({"ti": ti}) == ({"gpu_job_id": "j1"}, "running")
    assert ti.thread is not threading.main_thread()
    assert client.calls == ["jobs", "submit", "wait", "heartbeat"]


def test_a_failed_push_ends_the_started_job_and_fails_the_task(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", "*")
    client = Client()
    op = operator(client)
    monkeypatch.setattr(op, "_run", lambda context, job: pytest.fail("it started"))
    with pytest.raises(RuntimeError, match="could not be stored"):
        op._submit({"ti": TaskInstance(fails=True)})
    assert client.finished == [("j1", "failed", None, 1)]
