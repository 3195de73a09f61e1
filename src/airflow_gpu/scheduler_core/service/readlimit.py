"""Reads that may cost more than a request should (accounting over long windows) run
under a time limit: PostgreSQL cancels the statement (`statement_timeout`), SQLite's
progress handler interrupts it, and the Python work between statements checks the same
deadline. The server's shutdown stops such reads the same way (uvicorn waits for the
requests in flight before the app's own shutdown: a long read would hold it). A read
stopped either way is a ReadTooLong: 503, naming what to narrow."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

log = logging.getLogger("airflow_gpu.service")

READ_TIMEOUT_ENV = "AIRFLOW_GPU_READ_TIMEOUT"
DEFAULT_SECONDS = 30.0
_CANCELLED = "57014"          # PostgreSQL's query_canceled (a timeout or a cancel request)


class ReadTooLong(Exception):
    """A read stopped by its time limit or by the server's shutdown."""

    def __init__(self, message: str, shutdown: bool = False):
        super().__init__(message)
        self.shutdown = shutdown


def limit_seconds() -> float:
    """$AIRFLOW_GPU_READ_TIMEOUT (seconds, > 0), else DEFAULT_SECONDS."""
    raw = os.environ.get(READ_TIMEOUT_ENV) or ""
    if not raw:
        return DEFAULT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400 or math.isnan(value):
        log.warning("%s: %r is not a number of seconds (0 to 86400); using %g",
                    READ_TIMEOUT_ENV, raw, DEFAULT_SECONDS)
        return DEFAULT_SECONDS
    return value


class _Reads:
    """The bounded reads of one service in flight: their connections, to stop them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, object] = {}     # id(dbapi connection) -> the connection
        self.stopping = threading.Event()


_services: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_services_lock = threading.Lock()


def _reads(svc) -> _Reads:
    with _services_lock:
        state = _services.get(svc)
        if state is None:
            state = _services[svc] = _Reads()
        return state


class Deadline:
    """The session of a bounded read and its deadline, for the Python work between
    statements (`check()` raises once it has passed)."""

    def __init__(self, session: Session, deadline: float, seconds: float, narrow: str,
                 state: _Reads):
        self.session, self.deadline, self.seconds = session, deadline, seconds
        self.narrow, self.state = narrow, state

    def check(self) -> None:
        if self.state.stopping.is_set():
            raise ReadTooLong(_stopped(self.narrow), shutdown=True)
        if time.monotonic() > self.deadline:
            raise ReadTooLong(_timed_out(self.seconds, self.narrow))


def _timed_out(seconds: float, narrow: str) -> str:
    return (f"this read ran past the service's read limit ({seconds:g} s, "
            f"{READ_TIMEOUT_ENV}) and was stopped; {narrow}")


def _stopped(narrow: str) -> str:
    return f"the server is shutting down and stopped this read; retry it ({narrow})"


@contextmanager
def bounded(svc, narrow: str) -> Iterator[Deadline]:
    """A read session (svc.reads) whose statements and checks stop at the read limit or
    at shutdown; `narrow` says how to ask for less (it ends the 503's message)."""
    state = _reads(svc)
    seconds = limit_seconds()
    deadline = time.monotonic() + seconds
    if state.stopping.is_set():
        raise ReadTooLong(_stopped(narrow), shutdown=True)
    with svc.reads() as s:
        conn = s.connection()
        dbapi = conn.connection.dbapi_connection
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # every 1,000 virtual machine steps: a non-zero answer interrupts the statement
            dbapi.set_progress_handler(
                lambda: int(time.monotonic() > deadline or state.stopping.is_set()), 1000)
        else:      # for this transaction only (the session ends it)
            conn.exec_driver_sql(
                f"SET LOCAL statement_timeout = {max(1, math.ceil(seconds * 1000))}")
        with state.lock:
            state.live[id(dbapi)] = dbapi
        try:
            limit = Deadline(s, deadline, seconds, narrow, state)
            limit.check()
            yield limit
        except DBAPIError as e:
            orig = getattr(e, "orig", None)
            stopped = (getattr(orig, "sqlstate", None) == _CANCELLED if not sqlite
                       else "interrupted" in str(orig))
            if not stopped:
                raise
            if state.stopping.is_set():
                raise ReadTooLong(_stopped(narrow), shutdown=True) from None
            raise ReadTooLong(_timed_out(seconds, narrow)) from None
        finally:
            with state.lock:
                state.live.pop(id(dbapi), None)
            if sqlite:
                dbapi.set_progress_handler(None, 0)


def stop(svc) -> None:
    """Stop the service's bounded reads in flight, and refuse new ones (shutdown)."""
    state = _reads(svc)
    state.stopping.set()
    with state.lock:
        live = list(state.live.values())
    for dbapi in live:
        try:
            dbapi.interrupt() if hasattr(dbapi, "interrupt") else dbapi.cancel()
        except Exception as e:      # a connection that just closed: nothing to stop
            log.debug("stopping a read: %s", e)
    if live:
        log.info("shutdown: stopped %d read(s) in flight", len(live))


def stop_on_signals(svc) -> None:
    """On SIGTERM or SIGINT, stop the service's reads before the server waits for its
    requests, then let the server's own handler run. Only the main thread may set
    handlers (uvicorn's case); elsewhere (a test client's thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):        # default or ignored: not a server we serve in
            continue

        def handler(signum, frame, previous=previous):
            stop(svc)
            previous(signum, frame)

        signal.signal(sig, handler)
