"""Submits from the API, stored together: each request queues its job and awaits it, and
one task per service takes what is queued to a worker thread (one of the API's, so the
connection budget is unchanged), which inserts the new jobs in one transaction
(jobs.submit_many). A submit arriving alone goes at once, by itself; under load the
requests that arrive while a batch is written form the next one, so a commit, a trip to
a thread and the wake-up of the scheduling loop serve many submits."""

from __future__ import annotations

import asyncio
import weakref

import anyio

from ..jobspec import JobSpec
from ..service.common import Principal
from ..service.core import Service
from ..service.jobs import submit_many
from ..store.models import JobRow

BATCH = 64           # jobs in one transaction at most


class Writer:
    """The submits of one service on one event loop, waiting for the batch that stores
    them."""

    def __init__(self) -> None:
        self.queue: list[tuple[JobSpec, Principal, str | None, asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def submit(self, service: Service, spec: JobSpec, who: Principal,
                     key: str | None) -> tuple[JobRow, bool]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.queue.append((spec, who, key, done))
        if self.task is None:
            self.task = loop.create_task(self._drain(service))
        return await done

    async def _drain(self, service: Service) -> None:
        try:
            while self.queue:
                batch, self.queue = self.queue[:BATCH], self.queue[BATCH:]
                try:
                    results = await anyio.to_thread.run_sync(
                        submit_many, service, [(s, w, k) for s, w, k, _ in batch])
                except Exception as exc:      # e.g. the pool's timeout: each request's
                    results = [exc] * len(batch)
                except BaseException:         # cancelled (the loop is closing)
                    for *_, done in batch:
                        done.cancel()
                    raise
                for (*_, done), result in zip(batch, results, strict=True):
                    if done.done():           # its request went away
                        continue
                    if isinstance(result, Exception):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:
            self.task = None


# per event loop (a server process has one; tests may run several), then per service
_writers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def submit(service: Service, spec: JobSpec, who: Principal,
                 key: str | None) -> tuple[JobRow, bool]:
    """service.submit(spec, who, key), stored with the submits arriving meanwhile."""
    loop = asyncio.get_running_loop()
    mine = _writers.get(loop)
    if mine is None:
        mine = _writers[loop] = weakref.WeakKeyDictionary()
    writer = mine.get(service)
    if writer is None:
        writer = mine[service] = Writer()
    return await writer.submit(service, spec, who, key)
