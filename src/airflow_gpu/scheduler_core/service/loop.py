"""The scheduling loop: expire leases and run a pass on a short interval, and at once
after submits and finishes. With PostgreSQL, the replicas of one deployment elect one
scheduler through an advisory lock held on a connection of its own: when the leader dies
its connection closes, the lock frees, and another replica takes it on its next tick.

The lock's key is a hash of the deployment: its configured name (`--deployment`), else
the schema its tables are in, so deployments sharing a database in different schemas
each schedule. The lock connection's application_name names the host and process, so
the other replicas (and /healthz) can say who holds it."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import time

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from .core import Service

log = logging.getLogger(__name__)

# The backend holding an advisory lock taken with a bigint key: pg_locks shows the key's
# high 32 bits as classid and its low ones as objid, with objsubid 1.
_HOLDER = text("""
    SELECT a.pid, host(a.client_addr) AS client_addr, a.application_name, a.backend_start
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = :hi AND l.objid::bigint = :lo
    LIMIT 1""")


def lock_key(deployment: str) -> int:
    """The advisory-lock key of a deployment ("schema NAME" or "deployment NAME"): a
    signed 64-bit hash, as pg_try_advisory_lock(bigint) takes it."""
    digest = hashlib.sha256(f"airflow-gpu scheduler/{deployment}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def application_name() -> str:
    """What the lock connection shows in pg_stat_activity (PostgreSQL keeps 63 bytes)."""
    return f"airflow-gpu scheduler {socket.gethostname()} pid {os.getpid()}"[:63]


class SchedulerLoop:
    COALESCE = 0.2           # seconds to wait after a wake-up, so bursts share a pass
    MAX_COALESCE = 0.5
    def __init__(self, service: Service, metrics=None, interval: float | None = None):
        self.service = service
        self.metrics = metrics
        self.interval = interval or service.settings.pass_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_conn = None
        self._lock_engine = None
        self.leader = False
        self.last_pass = 0.0     # seconds the last pass took
        self.last_pass_at: float | None = None    # when the last pass completed (epoch s)
        self.last_error: dict | None = None       # the last failed pass since: message, at
        self.started_at: float | None = None
        name = service.settings.deployment
        # what the lock is for: "deployment NAME", else "schema NAME" (known on first try)
        self.deployment: str | None = f"deployment {name}" if name else None
        self.lock_key: int | None = None
        self.lock_pid: int | None = None          # this replica's lock backend, leading
        self.holder: dict | None = None           # the lock's backend, another replica's
        self._holder_seen = False
        self.app_name = application_name()
        self._warned_at: float | None = None      # when the quiet-passes warning was logged

    def start(self) -> None:
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.service.wake.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._release()
        if self._lock_engine is not None:
            self._lock_engine.dispose()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._lead():
                    self.tick()
            except Exception as exc:   # a bad pass must not stop the loop; the next retries
                log.exception("scheduling pass failed")
                self.failed(exc)
                self._release()
            from .health import warning

            self.note_quiet(warning(self))
            self.service.wake.wait(self.interval)
            # Let a burst of submits or finishes gather into one pass; the longer passes
            # take, the longer the gathering, so passes never crowd out the API.
            self._stop.wait(min(self.MAX_COALESCE, max(self.COALESCE, 2 * self.last_pass)))
            self.service.wake.clear()

    def tick(self) -> list[str]:
        lost = self.service.expire_leases()
        t0 = time.perf_counter()
        admitted = self.service.schedule_pass()
        self.last_pass = time.perf_counter() - t0
        self.last_pass_at, self.last_error = time.time(), None
        if self.metrics:
            self.metrics.pass_seconds.observe(self.last_pass)
            self.metrics.admissions.inc(len(admitted))
            self.metrics.lease_expiries.inc(len(lost))
            for kind in self.service.pass_errors:    # one job or team it got past
                self.metrics.pass_errors.labels(kind).inc()
        return admitted

    def failed(self, exc: Exception) -> None:
        """A pass (or the leader election) raised: /healthz says what and when."""
        from .health import describe

        self.last_error = {"message": describe(exc), "at": time.time()}
        if self.metrics:
            self.metrics.pass_errors.labels("pass").inc()

    def note_quiet(self, warning: str | None, every: float = 60.0) -> None:
        """Log /healthz's warning that passes have stopped: when it starts, then at most
        every `every` seconds while it lasts, and once when passes complete again."""
        if warning is None:
            if self._warned_at is not None:
                self._warned_at = None
                log.info("%s: scheduling passes complete again", self.deployment
                         or "scheduler")
            return
        now = time.time()
        if self._warned_at is None or now - self._warned_at >= every:
            self._warned_at = now
            log.warning("%s: %s", self.deployment or "scheduler", warning)

    def _lead(self) -> bool:
        engine = self.service.engine
        if engine.dialect.name != "postgresql":
            self.leader = True          # SQLite: one process
            return True
        if self._lock_conn is not None:
            try:
                self._lock_conn.execute(text("SELECT 1"))
                return True
            except Exception:
                log.warning("%s: the scheduler lock's connection failed; this replica stops "
                            "scheduling until it gets the lock again", self.deployment)
                self._release()
        if self._lock_engine is None:     # a connection of its own, never pooled
            self._lock_engine = create_engine(
                engine.url, poolclass=NullPool,
                connect_args={"application_name": self.app_name})
        conn = self._lock_engine.connect()
        try:
            if self.lock_key is None:
                if self.deployment is None:
                    schema = conn.execute(text("SELECT current_schema()")).scalar()
                    self.deployment = f"schema {schema or 'public'}"
                self.lock_key = lock_key(self.deployment)
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                               {"k": self.lock_key}).scalar()
            if got:
                self.lock_pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
                conn.commit()
                self._lock_conn, self.leader, self.holder = conn, True, None
                self._holder_seen = False
                log.info("%s: this replica schedules now (advisory lock key %d, backend pid "
                         "%s, application_name %r)", self.deployment, self.lock_key,
                         self.lock_pid, self.app_name)
                return True
            k = self.lock_key & (2**64 - 1)
            found = conn.execute(_HOLDER, {"hi": k >> 32, "lo": k & 0xFFFFFFFF}).mappings().first()
            conn.commit()
        except BaseException:
            conn.close()
            raise
        conn.close()
        self.leader = False
        self._saw(dict(found) if found else None)
        return False

    def _saw(self, holder: dict | None) -> None:
        """Remember (and log when it changes) who holds the lock this replica did not get."""
        if holder and holder.get("backend_start") is not None:
            holder["backend_start"] = holder["backend_start"].isoformat()
        if self._holder_seen and holder == self.holder:
            return
        self.holder, self._holder_seen = holder, True
        if holder:
            log.info("%s: another replica schedules: advisory lock key %d is held by backend "
                     "pid %s (%s, client %s, connected %s); this one takes over when it stops",
                     self.deployment, self.lock_key, holder["pid"],
                     holder["application_name"] or "no application_name",
                     holder["client_addr"] or "local socket", holder["backend_start"])
        else:
            log.warning("%s: advisory lock key %d is held by a backend that pg_stat_activity "
                        "does not show to this database role (or was just released)",
                        self.deployment, self.lock_key)

    def _release(self) -> None:
        if self._lock_conn is not None:
            with contextlib.suppress(Exception):   # the connection may be dead already
                # Invalidate, not close: a closed connection goes back to the pool still
                # holding the session's advisory lock, and no replica (this one neither)
                # could ever lead again.
                self._lock_conn.invalidate()
                self._lock_conn.close()
        self._lock_conn, self.leader, self.lock_pid = None, False, None
