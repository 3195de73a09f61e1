"""The scheduling loop: expire leases and run a pass on a short interval, and at once
after submits and finishes. With PostgreSQL, replicas elect one scheduler through an
advisory lock held on a connection of its own: when the leader dies its connection
closes, the lock frees, and another replica takes it on its next tick."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from sqlalchemy import text

from .core import Service

log = logging.getLogger(__name__)
LOCK_KEY = 0x61676675   # "agfu": one scheduler per database


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
        self.leader = False
        self.last_pass = 0.0     # seconds the last pass took

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.service.wake.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._lead():
                    self.tick()
            except Exception:   # a bad pass must not stop the loop; the next one retries
                log.exception("scheduling pass failed")
                self._release()
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
        if self.metrics:
            self.metrics.pass_seconds.observe(self.last_pass)
            self.metrics.admissions.inc(len(admitted))
            self.metrics.lease_expiries.inc(len(lost))
        return admitted

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
                self._release()
        conn = engine.connect()
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
        conn.commit()
        if got:
            self._lock_conn, self.leader = conn, True
            log.info("this replica schedules now (advisory lock %#x)", LOCK_KEY)
            return True
        conn.close()
        self.leader = False
        return False

    def _release(self) -> None:
        if self._lock_conn is not None:
            with contextlib.suppress(Exception):   # the connection may be dead already
                # Invalidate, not close: a closed connection goes back to the pool still
                # holding the session's advisory lock, and no replica (this one neither)
                # could ever lead again.
                self._lock_conn.invalidate()
                self._lock_conn.close()
        self._lock_conn, self.leader = None, False
