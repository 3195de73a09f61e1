"""Watch a job's replicas: stream their log lines (prefixed with role and index), keep the
lease alive, and stop the rest as soon as one replica fails: a gang lives and dies whole."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .handle import Handle

TAIL = 20          # last lines kept per replica, for the failure message


class Interrupted(Exception):
    """The scheduler took the job back (requeued, cancelled, lost): stop the replicas. A
    preemption ("preempting") names the signal to send first and the grace before SIGKILL,
    so replicas can save a checkpoint."""

    def __init__(self, state: str, message: str, signal: str | None = None,
                 grace: float | None = None):
        self.state, self.signal, self.grace = state, signal, grace
        super().__init__(message)


@dataclass
class Outcome:
    ok: bool
    failed: str | None = None            # the first replica that failed
    exit_code: int | None = None
    tail: list[str] = field(default_factory=list)
    interrupted: Interrupted | None = None
    codes: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False              # stopped at the job's time limit
    endings: list[Ending] = field(default_factory=list)   # of the replicas told to stop

    def ended(self) -> str:
        """How the stopped replicas ended, for the message that ends the job."""
        return "; ".join(map(str, self.endings))


@dataclass
class Ending:
    """How a replica told to stop ended: by itself `after` seconds, or killed after the
    grace (its handle's `killed`)."""
    name: str
    code: int
    after: float
    killed: bool
    grace: float | None

    def __str__(self) -> str:
        if self.killed:
            grace = "the" if self.grace is None else f"the {self.grace:g} s"
            return f"{self.name} was killed after {grace} grace"
        return f"{self.name} exited by itself after {self.after:.1f} s with code {self.code}"


def stop_all(handles: list[Handle], grace: float | None = None,
             sig: str | None = None) -> None:
    if handles:
        with ThreadPoolExecutor(len(handles)) as pool:
            # no signal: the old call, which handles without a `sig` parameter accept
            list(pool.map(lambda h: h.stop(grace) if sig is None else h.stop(grace, sig),
                          handles))


def settle(handles: list[Handle]) -> None:
    """Wait for what the handles still free on threads (a container's removal)."""
    for h in handles:
        if hasattr(h, "settle"):
            h.settle()


def supervise(handles: list[Handle], log: logging.Logger,
              heartbeat: Callable[[], None] | None = None, interval: float = 15.0,
              stop: threading.Event | None = None, deadline: float | None = None,
              grace: float = 0.0,
              on_line: Callable[[str, str], None] | None = None) -> Outcome:
    """Run until every replica exits, one fails, the scheduler takes the job back, the
    task is killed, or `deadline` (time.monotonic()) passes: then every replica gets
    SIGTERM, and SIGKILL `grace` seconds later. A preemption sends its own signal and
    grace. While replicas stop (time limit, preemption) their log lines and heartbeats go
    on until every replica has exited, and how each ended is logged and kept in the
    outcome's `endings`. Each line a replica writes goes to `on_line(name, line)`, else to
    `log` as `[name] line`."""
    events: queue.Queue = queue.Queue()
    tails = {h.name: deque(maxlen=TAIL) for h in handles}

    def read(h: Handle) -> None:
        try:
            for line in h.lines():
                events.put((h.name, line, None))
        finally:
            try:
                code = h.wait()
            except Exception as exc:   # never leave the loop below waiting for this one
                log.warning("[%s] its exit code cannot be read (%s)", h.name, exc)
                code = -1
            events.put((h.name, None, (code, time.monotonic())))

    for h in handles:
        threading.Thread(target=read, args=(h,), name=f"log-{h.name}", daemon=True).start()
    codes: dict[str, int] = {}
    next_beat = time.monotonic() + interval
    outcome: Outcome | None = None
    stopping: Interrupted | None = None      # a preemption or the time limit stops them
    timed_out = False
    told: dict[str, float] = {}              # replicas told to stop: since when
    endings: list[Ending] = []
    while len(codes) < len(handles):
        if stop is not None and stop.is_set():
            stop_all(handles)
            return Outcome(False, interrupted=Interrupted("killed", "the task was killed"))
        # while a preemption stops them, its grace (not the time limit) bounds the wait
        if deadline is not None and stopping is None and time.monotonic() >= deadline:
            timed_out = True
            stopping = Interrupted("timeout", "the job reached its time limit", grace=grace)
            rest = _running(handles, codes, told)
            log.warning("the job reached its time limit: sending SIGTERM to %d replica(s), "
                        "SIGKILL after %gs to any still running", len(rest), grace)
            stopper = _stop_in_background(rest, stopping, log, said=True)
        if heartbeat is not None and time.monotonic() >= next_beat:
            next_beat = time.monotonic() + interval
            try:
                heartbeat()
            except Interrupted as why:
                if stopping is not None:     # stopping: the beats only keep the lease
                    if why.state != "preempting" and not timed_out:
                        stopping = why       # taken back meanwhile (deadline, cancel)
                elif why.state == "preempting":
                    stopping = why
                    stopper = _stop_in_background(_running(handles, codes, told), why, log)
                else:
                    log.warning("stopping all replicas: %s", why)
                    stop_all(handles)
                    return Outcome(False, interrupted=why, codes=codes)
        try:
            name, line, code = events.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is not None:
            tails[name].append(line)
            if on_line is None:
                log.info("[%s] %s", name, line)
            else:
                on_line(name, line)
            continue
        code, at = code
        codes[name] = code
        if name in told:
            h = next(h for h in handles if h.name == name)
            endings.append(Ending(name, code, at - told[name], getattr(h, "killed", False),
                                  stopping.grace if stopping else None))
            log.info("[%s] %s", name, str(endings[-1]).removeprefix(name + " "))
        else:
            log.info("[%s] exited with code %s", name, code)
        if code != 0 and outcome is None and stopping is None:
            outcome = Outcome(False, name, code, list(tails[name]))
            rest = [h for h in handles if h.name not in codes]
            if rest:
                log.warning("%s failed: stopping the other %d replica(s)", name, len(rest))
                stop_all(rest)
    if stopping is not None:
        # the replicas have exited; their stops still free what they used (cgroups),
        # which must be gone before a new attempt of the job reuses the names
        stopper.join()
        if timed_out:
            return Outcome(False, codes=codes, timed_out=True, endings=endings)
        return Outcome(False, interrupted=stopping, codes=codes, endings=endings)
    if outcome is None:
        outcome = Outcome(True)
    outcome.codes = codes
    return outcome


def _running(handles: list[Handle], codes: dict[str, int],
             told: dict[str, float]) -> list[Handle]:
    """The replicas still running, marked as told to stop from now."""
    rest = [h for h in handles if h.name not in codes]
    told.update((h.name, time.monotonic()) for h in rest)
    return rest


def _stop_in_background(handles: list[Handle], why: Interrupted, log: logging.Logger,
                        said: bool = False) -> threading.Thread:
    """Stop the replicas with the signal and grace of a preemption or the time limit,
    without blocking the loop: it keeps logging their lines (a checkpoint being saved,
    the last words at the limit) and the lease. `said`: the caller logged the stop."""
    after = "the runner's default grace" if why.grace is None else f"{round(why.grace, 1):g}s"
    if not said:
        log.info("sending %s to %d replica(s), SIGKILL after %s",
                 why.signal or "SIGTERM", len(handles), after)

    def run() -> None:
        try:
            stop_all(handles, why.grace, why.signal)
        except Exception as exc:     # never leave replicas running: the loop waits for them
            log.warning("stopping with %s failed (%s): killing the replicas", why.signal, exc)
            stop_all(handles, 0)

    thread = threading.Thread(target=run, name="replica-stop", daemon=True)
    thread.start()
    return thread
