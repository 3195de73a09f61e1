"""What tells waiting requests (`GET /api/v1/jobs/{id}/wait`, `POST /api/v1/jobs/wait`)
that jobs may have changed: a counter this process bumps after each scheduling pass and
whenever a change wakes the loop (a submit, a finish, a cancel), and a way for async
handlers to sleep until the next bump. Changes made by another replica are seen by the
waiters' own re-reads (`POLL`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

POLL = 0.5      # seconds between a waiter's re-reads when nothing here bumps


class Changes:
    def __init__(self) -> None:
        self.version = 0
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def bump(self) -> None:
        """Jobs may have changed: wake every waiter (from any thread)."""
        with self._lock:
            self.version += 1
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):   # its loop closed: nobody waits
                loop.call_soon_threadsafe(_resolve, fut)

    async def wait(self, version: int, timeout: float) -> None:
        """Return at the first bump after `version`, or after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if self.version != version:
                return
            self._waiters.append((loop, fut))
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                if (loop, fut) in self._waiters:
                    self._waiters.remove((loop, fut))


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Wake(threading.Event):
    """The loop's wake-up (set when a pass is worth running now), which also tells the
    waiting requests."""

    def __init__(self, changes: Changes):
        super().__init__()
        self.changes = changes
        self.freed = False       # a job ended: GPUs came back, the next job should start

    def set(self, freed: bool = False) -> None:
        self.freed = self.freed or freed
        super().set()
        self.changes.bump()

    def clear(self) -> None:
        self.freed = False
        super().clear()
