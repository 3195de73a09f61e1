"""Preemption's checkpoint-aware stop: the replicas get the job class's signal, SIGKILL
only after the grace; the supervisor keeps logging and heartbeating meanwhile; a restarted
replica learns it restarts. Real processes and, where the engine runs, real containers."""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_gpu.launch.docker import DockerLauncher
from airflow_gpu.launch.handle import signal_of
from airflow_gpu.launch.local import start_callable, start_command
from airflow_gpu.launch.replica import Replica, needs_cluster, replicas_of
from airflow_gpu.launch.supervise import Interrupted, supervise
from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.scheduler_core.client import ApiError

KILLED = -signal.SIGKILL


def replica(index: int = 0, job_id: str | None = None, attempt: int = 1,
            reason: str | None = None) -> Replica:
    """A replica of a job of its own (`job_id`: else a fresh one): its cgroup is never
    another test's, whose cleanup could remove it under this one."""
    return Replica(job_id or f"job-preempt-{uuid.uuid4().hex[:8]}", "worker", index, index,
                   "here", "127.0.0.1", None, [], [], [], 64 * 2**20, [], attempt, reason)


def saves(mark: Path) -> str:
    """A replica that saves a checkpoint on SIGUSR1 and exits 0 by itself."""
    return (f"trap 'echo checkpoint saved; echo saved > {mark}; exit 0' USR1; "
            f"touch {mark}.ready; echo started; while :; do sleep 0.1; done")


def ignores(mark: Path) -> str:
    """A replica that ignores SIGUSR1: only SIGKILL ends it."""
    return f"trap '' USR1; touch {mark}.ready; echo started; while :; do sleep 0.1; done"


def started(handle) -> None:
    assert next(iter(handle.lines())) == "started"


# -- one handle -----------------------------------------------------------------------------
def test_signal_names():
    assert signal_of(None) is signal.SIGTERM
    assert signal_of("SIGUSR1") is signal.SIGUSR1 and signal_of("int") is signal.SIGINT
    with pytest.raises(ValueError, match="stop signal 'SIGNOPE' is not a signal name"):
        signal_of("SIGNOPE")


def test_a_process_saves_its_checkpoint_and_exits_on_its_signal(tmp_path):
    mark = tmp_path / "mark"
    h = start_command(replica(), saves(mark), {})[0]
    started(h)
    h.stop(grace=5, sig="SIGUSR1")
    assert h.wait() == 0                   # it exited by itself, before the grace
    assert mark.read_text() == "saved\n"


def test_a_process_that_ignores_its_signal_is_killed_after_the_grace(tmp_path):
    h = start_command(replica(), ignores(tmp_path / "mark"), {})[0]
    started(h)
    h.stop(grace=1, sig="SIGUSR1")
    assert h.wait() == KILLED


def test_without_a_signal_the_stop_is_sigterm_as_before(tmp_path):
    h = start_command(replica(), "trap 'exit 143' TERM; echo started; "
                      "while :; do sleep 0.1; done", {})[0]
    started(h)
    h.stop(grace=5)
    assert h.wait() == 143


def _checkpointing(mark: str) -> str:
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: stop.set())
    print("started", flush=True)
    stop.wait(600)
    Path(mark).write_text("saved")
    return "saved"


def _ignoring() -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print("started", flush=True)
    time.sleep(600)


def _stop_while_reaped(h, grace: float) -> int:
    """A callable's stop learns of its end from its log reader (the supervisor's)."""
    codes = []
    reader = threading.Thread(target=lambda: (list(h.lines()), codes.append(h.wait())))
    reader.start()
    h.stop(grace=grace, sig="SIGUSR1")
    reader.join(30)
    return codes[0]


def test_a_callable_gets_the_signal_and_sigkill_after_the_grace(tmp_path):
    mark = tmp_path / "mark"
    h = start_callable(replica(), _checkpointing, (str(mark),), {}, {})[0]
    started(h)
    assert _stop_while_reaped(h, 5) == 0 and h.value == "saved"
    assert mark.read_text() == "saved"
    h = start_callable(replica(), _ignoring, (), {}, {})[0]
    started(h)
    assert _stop_while_reaped(h, 1) == KILLED


# -- containers -----------------------------------------------------------------------------
def container(image: str, script: str, tmp_path: Path):
    launcher = DockerLauncher(image=image, command=["sh", "-c", script],
                              network_mode="none", mounts=[f"{tmp_path}:/out"],
                              shm_size=None)
    h = launcher.start(replica(job_id=uuid.uuid4().hex), {})
    started(h)
    return h


def test_a_container_saves_its_checkpoint_on_its_signal(image, tmp_path):
    h = container(image, saves(Path("/out/mark")), tmp_path)
    # a grace long enough for a loaded Docker daemon: it ends at the trap, long before
    h.stop(grace=30, sig="SIGUSR1")
    assert h.wait() == 0
    assert (tmp_path / "mark").read_text() == "saved\n"


def test_a_container_that_ignores_its_signal_is_killed_after_the_grace(image, tmp_path):
    h = container(image, ignores(Path("/out/mark")), tmp_path)
    h.stop(grace=1, sig="SIGUSR1")
    assert h.wait() == 128 + signal.SIGKILL


# -- the supervisor -------------------------------------------------------------------------
def preempting_when_ready(marks: list[Path], then: list[Interrupted] | None = None,
                          grace: float = 5):
    """A heartbeat: "preempting" once every replica has set its trap, then `then`."""
    answers = list(then or [])

    def beat() -> None:
        if all(Path(f"{m}.ready").exists() for m in marks):
            if answers and beat.sent:
                raise answers.pop(0)
            beat.sent = True
            raise Interrupted("preempting", "preempted by job big (priority)",
                              signal="SIGUSR1", grace=grace)
    beat.sent = False
    return beat


def test_supervise_stops_replicas_with_the_preemption_signal(tmp_path, caplog):
    marks = [tmp_path / "m0", tmp_path / "m1"]
    handles = [start_command(replica(i), saves(m), {})[0] for i, m in enumerate(marks)]
    caplog.set_level(logging.INFO)
    out = supervise(handles, logging.getLogger("test"), preempting_when_ready(marks),
                    interval=0.1)
    assert not out.ok and out.interrupted.state == "preempting"
    assert out.codes == {"worker-0": 0, "worker-1": 0}
    assert all(m.read_text() == "saved\n" for m in marks)
    # the lines written during the grace are logged too
    assert "[worker-0] checkpoint saved" in caplog.text
    assert "sending SIGUSR1 to 2 replica(s), SIGKILL after 5s" in caplog.text


def test_supervise_kills_a_stubborn_replica_after_the_grace(tmp_path):
    marks = [tmp_path / "m0", tmp_path / "m1"]
    handles = [start_command(replica(0), saves(marks[0]), {})[0],
               start_command(replica(1), ignores(marks[1]), {})[0]]
    # the service requeues it by force while it is still stopping
    requeued = Interrupted("pending", "job is pending (requeued at the preemption deadline)")
    out = supervise(handles, logging.getLogger("test"),
                    preempting_when_ready(marks, [requeued], grace=1), interval=0.1)
    assert out.codes == {"worker-0": 0, "worker-1": KILLED}
    assert out.interrupted is requeued


# -- restarts -------------------------------------------------------------------------------
def test_restart_variables():
    env = replica(attempt=2, reason="preempted").env()
    assert (env["AIRFLOW_GPU_ATTEMPT"], env["AIRFLOW_GPU_RESTARTED"],
            env["AIRFLOW_GPU_REQUEUE_REASON"]) == ("2", "1", "preempted")
    env = replica().env()
    assert env["AIRFLOW_GPU_ATTEMPT"] == "1" and env["AIRFLOW_GPU_RESTARTED"] == "0"
    assert "AIRFLOW_GPU_REQUEUE_REASON" not in env


def test_replicas_of_a_requeued_job_carry_its_attempt():
    job = {"id": "j", "attempt": 3, "requeue_reason": "gpu_fault", "replicas": [
        {"live": True, "role": "w", "index": 0, "host": "h", "gpus": [0], "cpus": [1],
         "memory_by_numa": {"0": 2**30}, "nics": []}]}
    (r,) = replicas_of(job, {})
    assert (r.attempt, r.requeue_reason) == (3, "gpu_fault")
    assert r.env()["AIRFLOW_GPU_RESTARTED"] == "1"


def test_replicas_take_their_hosts_addresses_from_the_job_else_from_the_cluster():
    entry = {"live": True, "role": "w", "index": 0, "host": "h", "gpus": [0], "cpus": [1],
             "memory_by_numa": {"0": 2**30}, "nics": []}
    cluster = {"h": {"address": "10.0.0.9", "docker_url": "tcp://10.0.0.9:2376"}}
    older = {"id": "j", "attempt": 1, "replicas": [entry]}     # no addresses in the job
    assert needs_cluster(older)
    (r,) = replicas_of(older, cluster)
    assert (r.address, r.docker_url) == ("10.0.0.9", "tcp://10.0.0.9:2376")
    alone = {"id": "j", "attempt": 1, "replicas": [
        {**entry, "address": "10.0.0.1", "docker_url": None},
        {**entry, "live": False, "address": None}]}          # an ended admission's
    assert not needs_cluster(alone)
    (r,) = replicas_of(alone, cluster)
    assert (r.address, r.docker_url) == ("10.0.0.1", None)


def test_a_restarted_process_sees_the_variables():
    h = start_command(replica(attempt=2, reason="preempted"),
                      "echo $AIRFLOW_GPU_ATTEMPT $AIRFLOW_GPU_RESTARTED "
                      "$AIRFLOW_GPU_REQUEUE_REASON", {})[0]
    assert list(h.lines()) == ["2 1 preempted"] and h.wait() == 0


# -- the operator ---------------------------------------------------------------------------
class Service:
    """The service's answers to one preempted job (the service side is tested with it)."""

    def __init__(self, deadline_in: float | None = 30, finish_status: int | None = None):
        at = datetime.now(UTC) + timedelta(seconds=deadline_in) if deadline_in else None
        self.row = {"id": "j1", "attempt": 1, "state": "preempting", "preempted_by": "j9",
                    "preempt_reason": "priority 100 preempts below 50",
                    "preempt_signal": "SIGUSR1", "preempt_grace": 60,
                    "preempt_deadline_at": at.isoformat() if at else None, "replicas": []}
        self.finish_status, self.finished = finish_status, []

    def heartbeat(self, job_id, attempt=None):
        return dict(self.row)

    def finish(self, job_id, outcome, exit_code=None, attempt=None):
        self.finished.append((job_id, outcome, exit_code, attempt))
        if self.finish_status:
            raise ApiError(self.finish_status, "job j1 is not preempting")
        self.row = {**self.row, "state": "pending"}
        return self.row

    def job(self, job_id):
        return dict(self.row)

    def notifications(self, job_id):
        return []                   # no webhook: the task log names none


def test_the_heartbeat_turns_a_preemption_into_its_signal_and_grace(capsys):
    op = GpuBashOperator(task_id="t", bash_command="true")
    service = Service(deadline_in=30)
    with pytest.raises(Interrupted) as raised:
        op._beat(service, "j1", 1)
    why = raised.value
    assert why.state == "preempting" and why.signal == "SIGUSR1"
    assert 25 < why.grace <= 30             # the deadline comes before the 60s grace
    assert "preempted by job j9 (priority 100 preempts below 50)" in str(why)
    said = capsys.readouterr().out          # Airflow's task logger writes to stdout
    assert "sending SIGUSR1 to all replicas, SIGKILL after 30s" in said
    assert "requeued under the same id" in said
    service = Service(deadline_in=None)
    with pytest.raises(Interrupted) as raised:
        op._beat(service, "j1", 1)
    assert raised.value.grace == 60


@pytest.mark.parametrize("finish_status", [None, 409])
def test_a_preempted_task_reports_it_and_waits_deferred(finish_status):
    from airflow_gpu.launch.supervise import Outcome

    op = GpuBashOperator(task_id="t", bash_command="true")
    service = Service(finish_status=finish_status)
    why = Interrupted("preempting", "preempted by job j9", signal="SIGUSR1", grace=5)
    with pytest.raises(TaskDeferred):      # a 409 on finish is only logged
        op._conclude(service, "j1", 1, [], Outcome(False, interrupted=why,
                                                  codes={"main-0": 0}))
    assert service.finished == [("j1", "preempted", None, 1)]
