"""`airflow-gpu run` (srun) against a real server: the command runs on its grant as the
local runner applies it, its exit code passes through, a grant on another host is refused,
signals reach the command and end the job, and a pending job shows why it waits.

The cluster is one host, `host-1`, whose model is this machine (its CPUs, one NUMA node,
four declared GPUs), and AIRFLOW_GPU_LOCAL_HOST=host-1 names this machine in it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml

from airflow_gpu.scheduler_core.engine.topology import parse_cpulist
from tests.e2e.conftest import create_token, machine_model
from tests.helpers import PYTHONPATH, REPO, until
from tests.servers import Server

LEASE = 8.0          # seconds: the commands below outlive it; short enough to wait out,
                     # long enough that a loaded machine's slow heartbeat is no loss
SMALL = ("--memory", "64MiB", "--poll-interval", "0.2")


@contextlib.contextmanager
def run_server(tmp: Path, lease: float, *args: str):
    """A real server (SQLite, its log in `tmp`) on one host, `host-1`, that is this
    machine: an admin client, and the environment `run` needs (team ml's token)."""
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "run", "hosts": [
        {"name": "host-1", "model": str(machine_model(tmp / "this-machine.yaml")),
         "rack": "r1", "switch": "s1"}]}))
    db = f"sqlite:///{tmp}/scheduler.db"
    srv = Server(db, cluster, lease_ttl=lease, log=tmp / "server.log", interval=0.2,
                 args=args)
    admin = httpx.Client(base_url=srv.url, timeout=10, headers={
        "Authorization": f"Bearer {create_token(db, 'ops', '--admin')}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__GPU_SCHEDULER")}
    env.update(AIRFLOW_GPU_URL=srv.url, AIRFLOW_GPU_TOKEN=create_token(db, "ml"),
               AIRFLOW_GPU_LOCAL_HOST="host-1", PYTHONPATH=PYTHONPATH)
    try:
        yield {"env": env, "admin": admin, "tmp": tmp, "log": tmp / "server.log"}
    finally:
        admin.close()
        srv.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with run_server(tmp_path_factory.mktemp("run-cli"), LEASE) as srv:
        yield srv


def job(server, job_id: str) -> dict:
    return server["admin"].get(f"/api/v1/jobs/{job_id}").raise_for_status().json()


def job_id_of(stderr: str) -> str:
    return re.search(r"airflow-gpu run: job (\S+) submitted", stderr).group(1)


def run(server, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "run", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**server["env"], **env})


def start(server, name: str, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """`airflow-gpu run` in the background, its stdout and stderr in files."""
    out, err = server["tmp"] / f"{name}.out", server["tmp"] / f"{name}.err"
    proc = subprocess.Popen([sys.executable, "-m", "airflow_gpu.cli", "run", *args],
                            cwd=REPO, env=server["env"], stdout=out.open("w"),
                            stderr=err.open("w"))
    return proc, out, err


def test_each_replica_sees_only_its_grant(server):
    script = ("import json, os; from tests.e2e.probe import probe; found = probe(); "
              "found['sched'] = sorted(os.sched_getaffinity(0)); "
              "print('PROBE ' + json.dumps(found))")
    got = run(server, "--replicas", "2", "--gpus", "2", "--cpus", "1", "--job-class",
              "validation", "--strict-isolation", *SMALL, "--", sys.executable, "-c", script)
    assert got.returncode == 0, got.stderr
    done = job(server, job_id_of(got.stderr))
    assert (done["state"], done["exit_code"]) == ("succeeded", 0)
    found = {m.group(1): json.loads(m.group(2)) for m in
             re.finditer(r"^\[(main-\d)\] PROBE (\{.*\})$", got.stdout, re.M)}
    assert set(found) == {"main-0", "main-1"}, got.stdout      # several: lines labelled
    grants = {f"{r['role']}-{r['index']}": r for r in done["replicas"]}
    for name, seen in found.items():
        grant = grants[name]
        assert seen["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, grant["gpus"]))
        assert len(grant["gpus"]) == 2 and seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert seen["sched"] == grant["cpus"] == parse_cpulist(seen["affinity"])
        assert parse_cpulist(seen["cgroup"]["cpus"]) == grant["cpus"]
        assert int(seen["cgroup"]["memory"]) == 64 * 2**20
        for path in seen["cgroup_paths"].values():     # removed when the process ended
            assert "airflow-gpu" in path and not Path(path).exists()
        env = seen["env"]
        assert env["AIRFLOW_GPU_JOB_ID"] == done["id"] and env["AIRFLOW_GPU_HOST"] == "host-1"
        assert env["AIRFLOW_GPU_ROLE"] == "main" and env["AIRFLOW_GPU_REPLICA"] == name[-1]
        assert env["AIRFLOW_GPU_GPUS"] == seen["env"]["CUDA_VISIBLE_DEVICES"]
        assert env["AIRFLOW_GPU_ATTEMPT"] == "1" and env["AIRFLOW_GPU_RESTARTED"] == "0"
    assert not set(grants["main-0"]["gpus"]) & set(grants["main-1"]["gpus"])
    assert "granted main-0 on host-1: GPUs" in got.stderr


def test_the_exit_code_passes_through_and_fails_the_job(server):
    got = run(server, "--gpus", "1", *SMALL, "--", "sh", "-c", "echo bye; exit 3")
    assert got.returncode == 3, got.stderr
    assert got.stdout == "bye\n"                      # one replica: no label
    done = job(server, job_id_of(got.stderr))
    assert (done["state"], done["exit_code"]) == ("failed", 3)


def test_a_job_file_names_the_job(server):
    spec = server["tmp"] / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "from-file", "roles": [
        {"name": "eval", "gpus": 1, "memory": "64MiB"}]}))
    got = run(server, str(spec), "--poll-interval", "0.2", "--", "sh", "-c",
              'echo "$AIRFLOW_GPU_ROLE $CUDA_VISIBLE_DEVICES"')
    assert got.returncode == 0, got.stderr
    done = job(server, job_id_of(got.stderr))
    assert (done["name"], done["state"]) == ("from-file", "succeeded")
    assert got.stdout == f"eval {done['replicas'][0]['gpus'][0]}\n"
    mixed = run(server, str(spec), "--gpus", "2", "--", "true")
    assert mixed.returncode == 2 and "not both" in mixed.stderr
    spec.write_text(yaml.safe_dump({"name": "many", "array": "0-3", "roles": [
        {"name": "eval", "gpus": 1, "memory": "64MiB"}]}))
    many = run(server, str(spec), "--", "true")
    assert many.returncode == 2 and "array: run starts one job here" in many.stderr


def test_a_dependency_waits_pending_then_runs_or_never_does(server):
    first, _, _ = start(server, "dep-first", "--gpus", "1", "--name", "dep-first", *SMALL,
                        "--", "sh", "-c", "sleep 3; exit 0")
    until(lambda: server["admin"].get("/api/v1/jobs?name=dep-first").json(), "dep-first")
    got = run(server, "--gpus", "1", "--dependency", "afterok:dep-first", *SMALL, "--",
              "sh", "-c", 'echo "after $AIRFLOW_GPU_JOB_ID"')
    assert first.wait(60) == 0
    assert got.returncode == 0, got.stderr
    assert "pending: Dependency: waits for " in got.stderr
    assert "after " + job_id_of(got.stderr) in got.stdout
    failed = run(server, "--gpus", "1", "--name", "dep-failed", *SMALL, "--", "false")
    assert failed.returncode == 1
    never = run(server, "--gpus", "1", "--dependency", "afterok:dep-failed", *SMALL, "--",
                "true")
    assert never.returncode == 1, never.stderr
    assert "is cancelled: DependencyNeverSatisfied: dep-failed (" in never.stderr
    assert "ended failed (exit code 1)" in never.stderr
    bad = run(server, "--gpus", "1", "--dependency", "afterok", "--", "true")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --dependency: afterok "
                                                         "names no job")


def test_a_machine_that_is_no_cluster_host_is_refused_before_submitting(server):
    mark = server["tmp"] / "ran"
    before = server["admin"].get("/api/v1/jobs").json()
    got = run(server, "--gpus", "1", *SMALL, "--", "touch", str(mark),
              AIRFLOW_GPU_LOCAL_HOST="host-9")
    assert got.returncode == 2, got.stderr
    assert got.stderr.startswith("error: this machine is 'host-9' (AIRFLOW_GPU_LOCAL_HOST), "
                                 "which is no host of the cluster 'run' (its hosts: host-1)")
    assert len(got.stderr.splitlines()) == 1 and not mark.exists()
    assert server["admin"].get("/api/v1/jobs").json() == before       # nothing submitted


def test_a_grant_on_another_host_is_refused_and_the_job_failed(monkeypatch, caplog):
    """The check after the grant stays: a grant the scheduler made elsewhere anyway."""
    from airflow_gpu.cli.commands.run_command import Run, Signals

    monkeypatch.setenv("AIRFLOW_GPU_LOCAL_HOST", "elsewhere")
    monkeypatch.delenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", raising=False)
    service = Preempting()
    args = argparse.Namespace(poll_interval=0.1, base_port=29500, strict_isolation=False)
    code = Run(service, {"name": "run.sh"}, ["true"], args, Signals()).run(service.row())
    assert code == 2, caplog.text
    assert ("1 of the job's 1 replica(s) were granted on another host than this machine, "
            "and airflow-gpu run starts processes only here: main-0 on here") in caplog.text
    assert "run `airflow-gpu run` on here" in caplog.text
    assert service.finished == [("failed", None, 1)]


def test_the_time_limit_stops_the_command_and_exits_124(server):
    got = run(server, "--gpus", "1", "--time-limit", "2s", *SMALL, "--", "sleep", "60")
    assert got.returncode == 124, got.stderr
    assert "the job reached its time limit of 2s" in got.stderr
    assert job(server, job_id_of(got.stderr))["state"] == "timeout"


def test_pending_shows_why_signals_cancel_and_reach_the_command(server):
    ready = server["tmp"] / "ready"
    holder, out, err = start(server, "holder", "--gpus", "4", *SMALL, "--", "sh", "-c",
                             f"trap 'echo got TERM; exit 5' TERM; touch {ready}; "
                             "while :; do sleep 0.1; done")
    try:
        until(ready.exists, "the first command to start", 60)
        first = job_id_of(err.read_text())
        waiter, _, wait_err = start(server, "waiter", "--gpus", "1", *SMALL, "--", "true")
        try:
            line = until(lambda: re.search(r"job (\S+) pending: Resources: .+\(ETA .+\)",
                                           wait_err.read_text()),
                         "the pending reason on stderr", 60)
            second = line.group(1)
            assert job(server, second)["state"] == "pending"
            time.sleep(LEASE + 1)           # past the first lease: heartbeats keep it
            assert job(server, first)["state"] == "running"
            waiter.send_signal(signal.SIGTERM)             # pending: cancels the job
            assert waiter.wait(30) == 128 + signal.SIGTERM
        finally:
            if waiter.poll() is None:
                waiter.kill()
        assert job(server, second)["state"] == "cancelled"
        assert f"SIGTERM while pending: job {second} cancelled" in wait_err.read_text()

        holder.send_signal(signal.SIGTERM)                 # running: reaches the command
        assert holder.wait(30) == 5
    finally:
        if holder.poll() is None:
            holder.kill()
    assert out.read_text().splitlines()[-1] == "got TERM"    # (sh may say "Terminated")
    done = job(server, first)
    assert done["state"] == "cancelled"
    assert f"stopped by SIGTERM: job {first} cancelled" in err.read_text()
    cluster = server["admin"].get("/api/v1/cluster").json()
    assert cluster["gpus_allocated"] == 0


# -- the preemption protocol, against a scripted service -------------------------------------
class Preempting:
    """A service that admits the job, preempts it at the first heartbeat after the start
    (SIGUSR1, 5 s grace), admits it again, and lets the second attempt run to its end."""

    def __init__(self):
        self.attempt, self.state, self.beats, self.finished = 1, "admitted", 0, []

    def row(self) -> dict:
        soon = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
        return {"id": "j1", "name": "run.sh", "state": self.state, "attempt": self.attempt,
                "requeue_reason": "preempted" if self.attempt > 1 else None,
                "lease_expires_at": soon, "deadline_at": None, "preempted_by": "j9",
                "preempt_reason": "priority 100 preempts below 50",
                "preempt_signal": "SIGUSR1", "preempt_grace": 5,
                "replicas": [{"role": "main", "index": 0, "host": "here", "gpus": [1],
                              "cpus": [sorted(os.sched_getaffinity(0))[0]],
                              "memory_by_numa": {"0": 64 * 2**20}, "nics": [],
                              "live": True}]}

    def heartbeat(self, job_id, attempt=None):
        assert attempt == self.attempt
        self.beats += 1
        if self.state == "admitted":
            self.state = "running"
        elif self.attempt == 1:
            self.state = "preempting"
        return self.row()

    def finish(self, job_id, outcome, exit_code=None, attempt=None):
        self.finished.append((outcome, exit_code, attempt))
        if outcome == "preempted":        # requeued, and admitted again at once
            self.attempt, self.state = self.attempt + 1, "admitted"
        else:
            self.state = outcome
        return self.row()

    def job(self, job_id):
        return self.row()

    def notifications(self, job_id):
        return []                         # no webhook: nothing to log

    def cluster(self):
        return {"hosts": [{"name": "here", "address": "127.0.0.1", "docker_url": None}]}


def test_a_preempted_command_gets_its_signal_and_restarts(monkeypatch, capsys):
    from airflow_gpu.cli.commands.run_command import Run, Signals, _logger

    monkeypatch.setenv("AIRFLOW_GPU_LOCAL_HOST", "here")
    monkeypatch.delenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", raising=False)
    service = Preempting()
    command = ["sh", "-c", "echo attempt $AIRFLOW_GPU_ATTEMPT restarted $AIRFLOW_GPU_RESTARTED"
               " $AIRFLOW_GPU_REQUEUE_REASON; [ $AIRFLOW_GPU_RESTARTED = 1 ] && exit 0; "
               "trap 'echo checkpoint; exit 0' USR1; while :; do sleep 0.1; done"]
    args = argparse.Namespace(poll_interval=0.1, base_port=29500, strict_isolation=False)
    _logger()
    code = Run(service, {"name": "run.sh"}, command, args, Signals()).run(service.row())
    out = capsys.readouterr()
    assert code == 0, out.err
    assert service.finished == [("preempted", None, 1), ("succeeded", 0, 2)]
    said = [line for line in out.out.splitlines() if line != "User defined signal 1"]
    assert said == ["attempt 1 restarted 0", "checkpoint",     # (sh on its killed sleep)
                    "attempt 2 restarted 1 preempted"]
    assert "preempted by job j9 (priority 100 preempts below 50): sending SIGUSR1" in out.err


def test_exit_codes_as_a_shell_shows_them():
    from airflow_gpu.cli.commands.run_args import split_command
    from airflow_gpu.cli.commands.run_command import exit_code

    assert (exit_code(0), exit_code(3), exit_code(-9), exit_code(-15)) == (0, 3, 137, 143)
    assert split_command(["job.yaml", "--", "a", "--", "b"]) == (["job.yaml"], ["a", "--", "b"])


def test_outside_airflow_the_setting_is_read_without_importing_airflow(tmp_path):
    from airflow_gpu.launch.local import airflow_setting

    cfg = tmp_path / "airflow.cfg"
    cfg.write_text("[core]\ndags_folder = {AIRFLOW_HOME}/dags\n[gpu_scheduler]\n"
                   "local_host = dgx-a-01\n")
    assert airflow_setting({"AIRFLOW_HOME": str(tmp_path)}) == "dgx-a-01"
    assert airflow_setting({"AIRFLOW_CONFIG": str(cfg)}) == "dgx-a-01"
    assert airflow_setting({"AIRFLOW_HOME": str(tmp_path),      # the variable wins
                            "AIRFLOW__GPU_SCHEDULER__LOCAL_HOST": "*"}) == "*"
    assert airflow_setting({"AIRFLOW_HOME": str(tmp_path / "none")}) is None


def test_the_pending_line_refreshes_in_place_on_a_terminal_and_adds_lines_elsewhere():
    import io

    from airflow_gpu.cli.commands.run_command import StatusLine, pending_line

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def pending(code, eta):
        return {"id": "j1", "state": "pending",
                "pending": {"code": code, "reason": "4 GPUs busy", "eta_seconds": eta}}

    for stream in (Terminal(), io.StringIO()):
        status = StatusLine(stream)
        for code, eta in (("Resources", 120), ("Resources", 60), ("Priority", 60)):
            status.show(*pending_line(pending(code, eta)))
        status.close()
        shown = stream.getvalue()
        if isinstance(stream, Terminal):      # every change, over the same line
            assert shown.count("\r\033[K") == 3 and shown.endswith("(ETA 1m)\n")
        else:                                 # a log: a line per reason
            assert shown.splitlines() == [
                "airflow-gpu run: job j1 pending: Resources: 4 GPUs busy (ETA 2m)",
                "airflow-gpu run: job j1 pending: Priority: 4 GPUs busy (ETA 1m)"]
