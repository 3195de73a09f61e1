"""`airflow-gpu run`: an interactive launcher outside Airflow, as Slurm's `srun`.

    airflow-gpu run job.yaml -- python eval.py
    airflow-gpu run --gpus 2 --cpus 8 --memory 32GiB --time-limit 1h -- python eval.py

It submits one job for this machine's host (run_args.py: the request, the flags, the
host), waits for admission showing the pending reason and ETA (one line on
stderr, refreshed when it changes), then runs the command once per replica granted on this
machine, with the grant applied as the local runner applies it for `GpuBashOperator`
(launch/local.py: CUDA_VISIBLE_DEVICES, CPU affinity, the cgroup, the AIRFLOW_GPU_*
variables), heartbeats the lease while it runs (launch/lease.py, launch/supervise.py) and
finishes the job with the command's exit code, which it exits with.

Signals: SIGINT, SIGTERM or SIGHUP while pending cancel the job (exit 128 + the signal).
While the command runs they are forwarded to it (its whole process group), SIGKILL follows
after the local runner's grace (10 s) or at once on a second signal; the job is then
cancelled, and the exit code is the command's, or 128 + the signal where the command
exited 0. A preemption and the time limit follow the operators' protocol (supervise.py).

Exit codes: the command's (killed by signal N: 128 + N); 124 at the job's time limit (job
`timeout`); 2 for bad input, an unreachable service, a grant on another host (job `failed`)
or a command that cannot start (job `failed`); 1 when the service answers with an error or
ends the job itself (cancelled elsewhere, lost)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import Any

from ...launch.handle import Handle, LaunchError
from ...launch.lease import Lease, beat_interval, monotonic_at
from ...launch.local import (
    STOP_GRACE,
    airflow_setting,
    local_host,
    refuse_other_hosts,
    start_command,
)
from ...launch.replica import Replica, needs_cluster, replicas_of
from ...launch.supervise import Outcome, stop_all, supervise
from ...launch.wiring import BY_CLASS, wiring
from ...scheduler_core.client import ApiError, Client
from ...scheduler_core.errors import InputError
from ..common import api_client
from .run_args import job_spec, options, pin_host, refused, split_command
from .run_output import PREFIX, Output, StatusLine, ended_why, pending_line

EXIT_INPUT = 2           # bad input, unreachable service, refused grant, cannot start
EXIT_ENDED = 1           # the service answered an error or ended the job itself
EXIT_TIMEOUT = 124       # the job's time limit (as GNU timeout)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WAITING = ("pending", "preempting")
STARTABLE = ("admitted", "running")

log = logging.getLogger("airflow_gpu.run")


def exit_code(code: int) -> int:
    """A process's exit code as a shell reports it: killed by signal N is 128 + N."""
    return code if code >= 0 else 128 - code


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged, not when run started."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _logger() -> logging.Logger:
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(PREFIX + "%(message)s"))
        log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    log.disabled = False
    return log


# -- signals -------------------------------------------------------------------------------
class Signals:
    """SIGINT, SIGTERM and SIGHUP: remembered (while pending: the job is cancelled) and,
    while the command runs, forwarded to its process group(s); SIGKILL after the grace, or
    at once on a second signal."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self.handles: list[Handle] | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        for s in SIGNALS:
            self._old[s] = signal.signal(s, self._received)
        return self

    def __exit__(self, *_) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _received(self, signum: int, _frame) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        self._forward(signal.Signals(signum).name)

    def attach(self, handles: list[Handle] | None) -> None:
        """The replicas to forward to (None: none run); one already received goes now."""
        self.handles = handles
        if handles and self.signum is not None:
            self._forward(self.name)

    def _forward(self, name: str) -> None:
        handles = list(self.handles or ())
        if not handles:
            return
        grace = STOP_GRACE if self.count == 1 else 0.0
        if self.count == 1:
            log.warning("%s: forwarding it to the command; SIGKILL after %gs (or at once on "
                        "another signal), then the job is cancelled", name, grace)
        else:
            log.warning("%s again: killing the command", name)
        threading.Thread(target=stop_all, args=(handles, grace, name), name="run-stop",
                         daemon=True).start()


# -- the run ---------------------------------------------------------------------------------
class Run:
    def __init__(self, client: Client, spec: dict, command: list[str],
                 args: argparse.Namespace, signals: Signals):
        self.client, self.spec, self.command = client, spec, command
        self.args, self.signals = args, signals
        self.poll = max(0.05, args.poll_interval)
        self.framework = BY_CLASS.get(spec.get("job_class") or "", "none")
        self.lease = Lease()
        self.status = StatusLine()

    def run(self, job: dict) -> int:
        job_id = job["id"]
        log.info("job %s submitted (%s)", job_id[:8], job["name"])   # ids shown: 8 chars
        while True:
            job_or_code = self.wait(job)
            if isinstance(job_or_code, int):
                return job_or_code
            code = self.attempt(job_or_code)
            if code is not None:
                return code
            job = self.client.job(job_id)      # preempted or requeued: wait again

    # waiting
    def wait(self, job: dict) -> dict | int:
        """Until the job is admitted (the job), or it ends or is cancelled (exit code)."""
        try:
            while True:
                if self.signals.signum is not None:
                    self.status.close()
                    return self.cancel(job["id"], f"{self.signals.name} while pending",
                                       128 + self.signals.signum)
                if job["state"] in STARTABLE:
                    return job
                if job["state"] not in WAITING:
                    self.status.close()
                    log.error("job %s is %s%s (see airflow-gpu explain %s)", job["id"][:8],
                              job["state"], ended_why(self.client, job), job["id"][:8])
                    return EXIT_ENDED
                self.status.show(*pending_line(job))
                job = self._refresh(job)
        finally:
            self.status.close()

    def _refresh(self, job: dict) -> dict:
        """The job once its state changes (a long poll: told as the pass that admits it
        commits), else as it is after `poll` seconds, for the status line."""
        try:
            return self.client.wait(job["id"], job["state"], min(self.poll, 60))
        except InputError as exc:               # a service restart: keep waiting
            self.status.close()
            log.warning("%s; retrying", exc)
            self._sleep(self.poll)
            return job

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.signals.signum is None and (left := end - time.monotonic()) > 0:
            time.sleep(min(0.1, left))

    def cancel(self, job_id: str, why: str, code: int) -> int:
        try:
            self.client.cancel(job_id)
            log.warning("%s: job %s cancelled", why, job_id[:8])
        except (ApiError, InputError) as exc:
            log.warning("%s: could not cancel job %s: %s", why, job_id[:8], exc)
        return code

    # running
    def attempt(self, job: dict) -> int | None:
        """Run the command on one admission; an exit code, or None to wait again (the job
        was preempted or requeued)."""
        job_id = job["id"]
        try:
            job = self.client.heartbeat(job_id, job["attempt"])     # confirms the start
        except ApiError as exc:
            if exc.status == 409:         # requeued, or ended, since: look again
                return None
            raise
        attempt = job["attempt"]
        hosts = ({h["name"]: h for h in self.client.cluster()["hosts"]}
                 if needs_cluster(job) else None)
        replicas = replicas_of(job, hosts)
        for r in replicas:
            log.info("granted %s", r.describe())
        try:
            refuse_other_hosts(
                replicas, local_host(airflow_setting()), runner="airflow-gpu run",
                fix="run `airflow-gpu run` on {host} itself")
        except LaunchError as exc:
            return self.refuse(job_id, attempt, exc)
        if self.signals.signum is not None:       # stopped before anything started
            return self.cancel(job_id, f"{self.signals.name} before the start",
                               128 + self.signals.signum)
        handles: list[Handle] = []
        try:
            self.start(replicas, handles)
        except LaunchError as exc:
            stop_all(handles)
            return self.refuse(job_id, attempt, exc)
        self.signals.attach(handles)
        try:
            outcome = supervise(handles, log,
                                lambda: self.lease.beat(self.client, job_id, attempt, log),
                                beat_interval(job), None, monotonic_at(job.get("deadline_at")),
                                float(job.get("stop_grace") or 0),
                                on_line=Output(len(replicas) > 1))
        finally:
            self.signals.attach(None)
        return self.conclude(job, attempt, outcome)

    def start(self, replicas: list[Replica], handles: list[Handle]) -> None:
        for r, wired in zip(replicas, wiring(self.framework, replicas, self.args.base_port),
                            strict=True):
            handle, warnings = start_command(r, self.command, wired, None,
                                             self.args.strict_isolation)
            for w in warnings:
                log.warning("%s: %s", r.name, w)
            handles.append(handle)

    def refuse(self, job_id: str, attempt: int, exc: LaunchError) -> int:
        log.error("%s", exc)
        self.finish(job_id, attempt, "failed", None)
        log.error("job %s finished as failed", job_id[:8])
        return EXIT_INPUT

    def conclude(self, job: dict, attempt: int, outcome: Outcome) -> int | None:
        job_id = job["id"]
        if self.signals.signum is not None:       # the user stopped it: cancel the job
            codes = [exit_code(c) for c in outcome.codes.values() if c]
            code = codes[0] if codes else 128 + self.signals.signum
            return self.cancel(job_id, f"stopped by {self.signals.name}", code)
        if outcome.timed_out:
            from ...scheduler_core.jobclasses import timeout_message

            self.finish(job_id, attempt, "timeout", None)
            log.error("job %s: %s", job_id[:8], timeout_message(
                job["time_limit_s"], job.get("stop_grace") or 0,
                outcome.ended()))
            return EXIT_TIMEOUT
        if outcome.ok:
            self.finish(job_id, attempt, "succeeded", 0)
            return 0
        why = outcome.interrupted
        if why is not None and why.state == "preempting":
            log.warning("job %s: the command stopped after the preemption (exit codes %s); "
                        "waiting for a new placement under the same id", job_id[:8],
                        outcome.codes or "-")
            self.finish(job_id, attempt, "preempted", None)
            return None
        if why is not None and why.state == "pending":
            log.warning("the scheduler requeued job %s (%s): waiting for a new placement",
                        job_id[:8], why)
            return None
        if why is not None:
            log.error("job %s: %s", job_id[:8], why)
            return EXIT_ENDED
        self.finish(job_id, attempt, "failed", outcome.exit_code)
        code = exit_code(outcome.exit_code if outcome.exit_code is not None else 1)
        log.warning("job %s failed: %s exited with code %s", job_id[:8], outcome.failed,
                    outcome.exit_code)
        return code

    def finish(self, job_id: str, attempt: int, outcome: str, code: int | None) -> None:
        try:
            self.client.finish(job_id, outcome, code, attempt)
        except (ApiError, InputError) as exc:
            log.warning("could not report the end of job %s: %s", job_id[:8], exc)


def cmd_run(args: argparse.Namespace) -> int:
    before, command = split_command(args.rest)
    if before:               # a job file, and options written after it
        options(argparse.ArgumentParser(prog="airflow-gpu run", add_help=False),
                positional=True).parse_args(before, namespace=args)
    spec = job_spec(args, command)
    _logger()
    with Signals() as signals, api_client(args) as client:
        spec = pin_host(spec, args, client.cluster(), local_host(airflow_setting()))
        try:
            job = client.submit(spec)
        except ApiError as exc:
            if exc.status != 422:
                raise
            raise refused(spec, exc) from None
        return Run(client, spec, command, args, signals).run(job)


def add_commands(sub) -> None:
    p = sub.add_parser(
        "run", help="submit a job, wait for it, run a command on its grant here (srun)",
        usage="airflow-gpu run [JOBFILE] [options] -- COMMAND [ARG...]",
        description="Submit one job (JOBFILE, or a one-role job from the flags), wait for "
        "admission showing the pending reason and ETA, run COMMAND once per replica granted "
        "on this machine with the grant applied (CUDA_VISIBLE_DEVICES, CPU affinity, "
        "cgroup, AIRFLOW_GPU_*), keep the lease alive, and finish the job with the "
        "command's exit code, which it exits with. Ctrl-C while pending cancels the job; "
        "while running it is forwarded to the command and the job is cancelled. "
        "docs/service.md, 'Interactive jobs: airflow-gpu run'.")
    options(p, positional=False)
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_run, jobfile=None)
