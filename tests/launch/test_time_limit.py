"""Replicas at the job's time limit: the supervisor sends SIGTERM to every replica and
SIGKILL to those still running after the grace (local processes and Python callables)."""

from __future__ import annotations

import logging
import signal
import time

from airflow_gpu.launch.local import start_callable, start_command
from airflow_gpu.launch.supervise import supervise
from tests.launch.test_launch import replica

POLITE = "trap 'echo checkpoint saved; exit 143' TERM; echo started; while :; do sleep 0.1; done"
STUBBORN = "trap 'echo ignoring TERM' TERM; echo started; while :; do sleep 0.1; done"


def _ignore_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("started", flush=True)
    time.sleep(600)


def test_replicas_get_sigterm_at_the_limit_and_sigkill_after_the_grace(caplog):
    handles = [start_command(replica([]), POLITE, {})[0],
               start_command(replica([]), STUBBORN, {})[0],
               start_callable(replica([]), _ignore_term, (), {}, {})[0]]
    for h, name in zip(handles, ("polite", "stubborn", "callable"), strict=True):
        h.name = name
    caplog.set_level(logging.INFO)
    out = supervise(handles, logging.getLogger("test"), deadline=time.monotonic() + 1.5,
                    grace=1.0)
    assert out.timed_out and not out.ok
    codes = {h.name: h.wait() for h in handles}
    assert codes == {"polite": 143, "stubborn": -signal.SIGKILL,
                     "callable": -signal.SIGKILL}, codes
    lines = caplog.text
    assert "[polite] started" in lines and "[stubborn] started" in lines
    assert "the job reached its time limit" in lines


def test_a_job_that_ends_before_its_limit_is_not_stopped():
    h = start_command(replica([]), "echo done", {})[0]
    out = supervise([h], logging.getLogger("test"), deadline=time.monotonic() + 60,
                    grace=1.0)
    assert out.ok and not out.timed_out and out.codes == {h.name: 0}


class _Vanished:
    """A replica whose exit code cannot be read (its container was removed meanwhile),
    once `after` (a replica beside it) has exited: the order the test asserts."""
    name = "gone"

    def __init__(self, after):
        self.after = after

    def lines(self):
        yield "last words"

    def wait(self) -> int:
        self.after.proc.wait()
        raise RuntimeError("404 Client Error: No such container")

    def stop(self, grace=None) -> None:
        pass


def test_a_replica_whose_exit_code_is_lost_does_not_hang_the_supervisor():
    h = start_command(replica([]), "echo fine", {})[0]
    out = supervise([h, _Vanished(h)], logging.getLogger("test"))
    assert not out.ok and out.failed == "gone" and out.codes == {h.name: 0, "gone": -1}
