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
    """The scheduler took the job back (requeued, cancelled, lost): stop the replicas."""

    def __init__(self, state: str, message: str):
        self.state = state
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


def stop_all(handles: list[Handle], grace: float | None = None) -> None:
    if handles:
        with ThreadPoolExecutor(len(handles)) as pool:
            list(pool.map(lambda h: h.stop(grace), handles))


def supervise(handles: list[Handle], log: logging.Logger,
              heartbeat: Callable[[], None] | None = None, interval: float = 15.0,
              stop: threading.Event | None = None, deadline: float | None = None,
              grace: float = 0.0) -> Outcome:
    """Run until every replica exits, one fails, the scheduler takes the job back, the
    task is killed, or `deadline` (time.monotonic()) passes: then every replica gets
    SIGTERM, and SIGKILL `grace` seconds later."""
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
            events.put((h.name, None, code))

    for h in handles:
        threading.Thread(target=read, args=(h,), name=f"log-{h.name}", daemon=True).start()
    codes: dict[str, int] = {}
    next_beat = time.monotonic() + interval
    outcome: Outcome | None = None
    while len(codes) < len(handles):
        if stop is not None and stop.is_set():
            stop_all(handles)
            return Outcome(False, interrupted=Interrupted("killed", "the task was killed"))
        if deadline is not None and time.monotonic() >= deadline:
            log.warning("the job reached its time limit: stopping all replicas (SIGTERM, "
                        "SIGKILL after %gs)", grace)
            stop_all([h for h in handles if h.name not in codes], grace)
            return Outcome(False, codes=codes, timed_out=True)
        if heartbeat is not None and time.monotonic() >= next_beat:
            next_beat = time.monotonic() + interval
            try:
                heartbeat()
            except Interrupted as why:
                log.warning("stopping all replicas: %s", why)
                stop_all(handles)
                return Outcome(False, interrupted=why, codes=codes)
        try:
            name, line, code = events.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is not None:
            tails[name].append(line)
            log.info("[%s] %s", name, line)
            continue
        codes[name] = code
        log.info("[%s] exited with code %s", name, code)
        if code != 0 and outcome is None:
            outcome = Outcome(False, name, code, list(tails[name]))
            rest = [h for h in handles if h.name not in codes]
            if rest:
                log.warning("%s failed: stopping the other %d replica(s)", name, len(rest))
                stop_all(rest)
    if outcome is None:
        outcome = Outcome(True)
    outcome.codes = codes
    return outcome
