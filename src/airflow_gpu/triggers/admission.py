"""Deferrable admission: wait in the triggerer, not in a worker slot, until the
scheduler-core admits, cancels or loses the job; told within a moment of the admission
(watch.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ..hooks.scheduler import GpuSchedulerHook
from ..scheduler_core.client import ApiError
from ..scheduler_core.errors import InputError
from ..scheduler_core.reasonkey import reason_key
from ..scheduler_core.units import format_duration
from .watch import Watcher

LIVE = ("admitted", "running")


class AdmissionTrigger(BaseTrigger):
    """Waits for the job's admission through the triggerer's watcher (watch.py: one long
    poll for all the deferred GPU tasks of this triggerer) and yields one event:
    `{"status": "admitted" | "cancelled" | "lost" | "failed" | "succeeded" | "missing" |
    "timeout", "job_id", "message"}`.

    `deadline` (Unix time) is enforced here, not through `defer(timeout=)`: only the
    Airflow scheduler applies that one (`airflow dags test` runs the trigger inline and
    never does), and it neither says why the job waited nor cancels it. At the deadline
    the job is cancelled and the event names the last pending reason; `timeout` (the
    operator's `admission_timeout`, seconds) is only for that message. `poll_interval`:
    how often at most the pending reason is read again (admission itself is told at
    once), and the seconds between retries while the scheduler is unreachable."""

    def __init__(self, job_id: str, gpu_scheduler_conn_id: str = "gpu_scheduler_default",
                 poll_interval: float = 5.0, deadline: float | None = None,
                 timeout: float | None = None):
        super().__init__()
        self.job_id = job_id
        self.gpu_scheduler_conn_id = gpu_scheduler_conn_id
        self.poll_interval = poll_interval
        self.deadline, self.timeout = deadline, timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"job_id": self.job_id, "gpu_scheduler_conn_id": self.gpu_scheduler_conn_id,
                 "poll_interval": self.poll_interval, "deadline": self.deadline,
                 "timeout": self.timeout})

    def _pause(self) -> float:
        """The next poll, or the deadline if it comes first."""
        if self.deadline is None:
            return self.poll_interval
        return max(0.0, min(self.poll_interval, self.deadline - time.time()))

    def _left(self) -> float | None:
        """Seconds to the deadline (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    def _expired(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    async def _time_out(self, reason: str | None) -> TriggerEvent:
        """Take the job out of the queue and say why it waited."""
        within = f"{self.timeout:g}s (admission_timeout)" if self.timeout is not None \
            else "its deadline"
        said = f"not admitted within {within}; waiting for: {reason or 'queued'}"
        try:
            hook = GpuSchedulerHook(self.gpu_scheduler_conn_id)
            async with await hook.aget_conn() as client:
                await client.cancel(self.job_id)
        except ApiError as exc:
            if exc.status not in (404, 409):
                said += f"; cancelling it failed: {exc}"
        except InputError as exc:
            said += f"; cancelling it failed: {exc}"
        else:
            said += "; the job is cancelled"
        return self._event("timeout", said)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # every look goes through the triggerer's watcher: no client, no request, per task
        watcher = Watcher.of(self.gpu_scheduler_conn_id)
        said = job = None
        while True:
            try:     # look at once first (and while it stops), then wait for a change
                now = job is None or job["state"] == "preempting"
                job = await watcher.next(self.job_id, self._left(),
                                         0 if now else self.poll_interval) or job
            except ApiError as exc:
                if exc.status == 404:
                    yield self._event("missing", f"job {self.job_id[:8]} is not in the "
                                      "scheduler (was its database reset?)")
                    return
                raise
            except InputError as exc:   # the service restarts or is unreachable: wait
                if self._expired():
                    yield await self._time_out(f"the scheduler ({exc})")
                    return
                self.log.warning("%s; retrying in %ss", exc, self.poll_interval)
                await asyncio.sleep(self._pause())
                job = None
                continue
            if job is None:             # the deadline came before the first look
                yield await self._time_out(None)
                return
            state = job["state"]
            if state in LIVE:
                yield self._event("admitted", "admitted on " + ", ".join(
                    sorted({r["host"] for r in job["replicas"] if r.get("live", True)})))
                return
            if state == "preempting":   # the last admission is still stopping
                await asyncio.sleep(self.poll_interval)
                continue
            if state != "pending":
                yield self._event(state, f"job {self.job_id[:8]} became {state} while "
                                  "waiting for admission")
                return
            reason = (job.get("pending") or {}).get("reason")
            # said again when its code, blockers or placement change, not its countdowns
            if reason_key(job) != said:
                eta = (job.get("pending") or {}).get("eta_seconds")
                # a deadline at risk is a warning: the DAG run's own deadline callback
                # fires only once it has passed
                at_risk = (job.get("pending") or {}).get("code") == "DeadlineAtRisk"
                (self.log.warning if at_risk else self.log.info)(
                    "waiting for GPUs: %s%s", reason or "queued",
                    f" (ETA {format_duration(eta)})" if eta is not None else "")
                said = reason_key(job)
            if self._expired():
                yield await self._time_out(reason)
                return

    def _event(self, status: str, message: str) -> TriggerEvent:
        return TriggerEvent({"status": status, "job_id": self.job_id, "message": message})

    async def on_kill(self) -> None:
        """The task was cleared or marked while waiting: take the job out of the queue."""
        hook = GpuSchedulerHook(self.gpu_scheduler_conn_id)
        async with await hook.aget_conn() as client:
            try:
                await client.cancel(self.job_id)
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
