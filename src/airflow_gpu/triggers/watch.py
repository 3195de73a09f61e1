"""One watcher per triggerer and connection serves every deferred GPU task waiting there:
one long-poll request at a time (POST /api/v1/jobs/wait) for all their jobs, so a
thousand deferred tasks cost the scheduler no more requests than one, and each task
hears of its admission as soon as the pass that admits it commits.

Bound: at most one request every `GAP` seconds per triggerer process and connection
(4 per second); while nothing changes, one every poll interval (the shortest of its
tasks' `poll_interval`, at most `REFRESH` seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from ..hooks.scheduler import GpuSchedulerHook
from ..scheduler_core.client import ApiError

GAP = 0.25        # seconds between two requests of one watcher
REFRESH = 10.0    # the long poll's longest timeout: each task hears its pending reason
RETRY = 2.0       # seconds after a failed request before the next

_watchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # loop -> {conn: w}


class Watcher:
    @classmethod
    def of(cls, conn_id: str) -> Watcher:
        """The watcher of this event loop (the triggerer's) for connection `conn_id`."""
        per_loop = _watchers.setdefault(asyncio.get_running_loop(), {})
        if conn_id not in per_loop:
            per_loop[conn_id] = cls(conn_id)
        return per_loop[conn_id]

    def __init__(self, conn_id: str):
        self.conn_id = conn_id
        self.waiting: dict[str, set[asyncio.Future]] = {}
        self.requests = 0                  # sent so far (for tests and benchmarks)
        self._joined = asyncio.Event()     # a task began waiting, or the last one left
        self._task: asyncio.Task | None = None

    async def next(self, job_id: str, timeout: float | None = None,
                   every: float = REFRESH) -> dict | None:
        """Job `job_id` as soon as it is no longer pending, or as it stands at the next
        refresh (at most `every` seconds from now); None if `timeout` seconds pass first.
        Raises what the request raised (ApiError 404 when the job does not exist)."""
        fut = asyncio.get_running_loop().create_future()
        fut.every = max(0.0, min(every, REFRESH))
        self.waiting.setdefault(job_id, set()).add(fut)
        self._joined.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return None
        finally:
            futs = self.waiting.get(job_id, set())
            futs.discard(fut)
            if not futs:
                self.waiting.pop(job_id, None)
                if not self.waiting:
                    self._joined.set()     # nobody waits: the request in flight can go

    async def _run(self) -> None:
        while self.waiting:      # checked again after each await that closes a client
            try:
                hook = GpuSchedulerHook(self.conn_id)
                async with await hook.aget_conn() as client:
                    while self.waiting:
                        await self._round(client)
            except Exception as exc:   # noqa: BLE001 - no connection, say: tasks decide
                self._deliver(list(self.waiting), exc)
                await asyncio.sleep(RETRY)

    async def _round(self, client) -> None:
        """One long poll for every waiting job; what it answers goes to their tasks."""
        self._joined.clear()
        ids = list(self.waiting)
        every = min(f.every for futs in self.waiting.values() for f in futs)
        request = asyncio.ensure_future(client.wait_many(ids, "pending", every))
        joined = asyncio.ensure_future(self._joined.wait())
        self.requests += 1
        await asyncio.wait({request, joined}, return_when=asyncio.FIRST_COMPLETED)
        joined.cancel()
        if not request.done():     # a task joined (or all left): ask again
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await request
            await asyncio.sleep(GAP)
            return
        try:
            body = request.result()
        except Exception as exc:   # noqa: BLE001 - each task decides (trigger.run)
            self._deliver(ids, exc)
            await asyncio.sleep(RETRY)
            return
        for job in body["jobs"]:
            self._deliver([job["id"]], job)
        self._deliver(body["missing"], ApiError(404, "no such job"))
        await asyncio.sleep(GAP)

    def _deliver(self, ids: list[str], what) -> None:
        for job_id in ids:
            for fut in self.waiting.get(job_id, ()):
                if fut.done():
                    continue
                if isinstance(what, BaseException):
                    fut.set_exception(what)
                else:
                    fut.set_result(what)
