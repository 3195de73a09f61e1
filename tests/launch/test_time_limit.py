"""Replicas at the job's time limit: the supervisor sends SIGTERM to every replica and
SIGKILL to those still running after the grace (local processes, Python callables and
containers); what they write meanwhile is kept, and how each ended is said."""

from __future__ import annotations

import logging
import signal
import time
import uuid

from airflow_gpu.launch.docker import DockerLauncher
from airflow_gpu.launch.local import start_callable, start_command
from airflow_gpu.launch.supervise import supervise
from tests.launch.test_launch import replica
from tests.launch.test_preempt_stop import replica as gpuless

POLITE = "trap 'echo checkpoint saved; exit 143' TERM; echo started; while :; do sleep 0.1; done"
STUBBORN = "trap 'echo ignoring TERM' TERM; echo started; while :; do sleep 0.1; done"
# says something at SIGTERM, and again a second later, then exits by itself
LAST_WORDS = ("trap 'echo saving; sleep 1; echo saved; exit 3' TERM; echo started; "
              "while :; do sleep 0.1; done")


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


def _stopped_at_the_limit(handles, caplog) -> tuple:
    """Supervise until the time limit (2 s) and a 3 s grace: the outcome, and the lines
    the replicas wrote, as (name, line)."""
    said: list[tuple[str, str]] = []
    caplog.set_level(logging.INFO)
    out = supervise(handles, logging.getLogger("test"), deadline=time.monotonic() + 2,
                    grace=3.0, on_line=lambda name, line: said.append((name, line)))
    assert out.timed_out and not out.ok
    return out, said


def _last_words(said: list[tuple[str, str]]) -> list[str]:
    """What "polite" wrote after SIGTERM (sh may also say "Terminated" of its sleep)."""
    lines = [line for name, line in said if name == "polite"]
    return [line for line in lines[lines.index("started") + 1:] if line != "Terminated"]


def _check_endings(out, caplog, killed_code: int) -> None:
    ended = {e.name: e for e in out.endings}
    polite, stubborn = ended["polite"], ended["stubborn"]
    # by itself, after its second of saving (how much later depends on the machine's load)
    assert (polite.killed, polite.code) == (False, 3) and polite.after >= 0.9
    assert (stubborn.killed, stubborn.code) == (True, killed_code)
    assert out.codes == {"polite": 3, "stubborn": killed_code}
    assert str(polite) == f"polite exited by itself after {polite.after:.1f} s with code 3"
    assert str(stubborn) == "stubborn was killed after the 3 s grace"
    assert f"[polite] exited by itself after {polite.after:.1f} s" in caplog.text
    assert "[stubborn] was killed after the 3 s grace" in caplog.text


def test_what_replicas_write_after_sigterm_is_kept_and_how_each_ended_is_said(caplog):
    handles = [start_command(replica([]), LAST_WORDS, {})[0],
               start_command(replica([]), STUBBORN, {})[0],
               start_callable(replica([]), _ignore_term, (), {}, {})[0]]
    for h, name in zip(handles, ("polite", "stubborn", "callable"), strict=True):
        h.name = name
    out, said = _stopped_at_the_limit(handles, caplog)
    # written after SIGTERM: "saved" a second later, by a replica that then exits
    assert _last_words(said) == ["saving", "saved"]
    assert ("stubborn", "ignoring TERM") in said
    assert {e.name: e.killed for e in out.endings}["callable"] is True
    del out.codes["callable"]
    _check_endings(out, caplog, -signal.SIGKILL)


def test_containers_keep_their_last_words_and_say_how_they_ended(image, caplog):
    handles = []
    for name, script in (("polite", LAST_WORDS), ("stubborn", STUBBORN)):
        launcher = DockerLauncher(image=image, command=["sh", "-c", script],
                                  network_mode="none", shm_size=None)
        handles.append(launcher.start(gpuless(job_id=uuid.uuid4().hex), {}))
        handles[-1].name = name
    try:
        out, said = _stopped_at_the_limit(handles, caplog)
    finally:
        for h in handles:
            h.stop(0)
    assert _last_words(said) == ["saving", "saved"]
    _check_endings(out, caplog, 128 + signal.SIGKILL)
