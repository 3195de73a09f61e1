"""Deferrable admission: wait in the triggerer, not in a worker slot, until the
scheduler-core admits, cancels or loses the job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ..hooks.scheduler import GpuSchedulerHook
from ..scheduler_core.client import ApiError
from ..scheduler_core.errors import InputError

LIVE = ("admitted", "running")


class AdmissionTrigger(BaseTrigger):
    """Polls the job every `poll_interval` seconds and yields one event:
    `{"status": "admitted" | "cancelled" | "lost" | "failed" | "succeeded" | "missing",
    "job_id", "message"}`."""

    def __init__(self, job_id: str, gpu_scheduler_conn_id: str = "gpu_scheduler_default",
                 poll_interval: float = 5.0):
        super().__init__()
        self.job_id = job_id
        self.gpu_scheduler_conn_id = gpu_scheduler_conn_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"job_id": self.job_id, "gpu_scheduler_conn_id": self.gpu_scheduler_conn_id,
                 "poll_interval": self.poll_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = GpuSchedulerHook(self.gpu_scheduler_conn_id)
        said = None
        async with await hook.aget_conn() as client:
            while True:
                try:
                    job = await client.job(self.job_id)
                except ApiError as exc:
                    if exc.status == 404:
                        yield self._event("missing", f"job {self.job_id} is not in the "
                                          "scheduler (was its database reset?)")
                        return
                    raise
                except InputError as exc:   # the service restarts or is unreachable: wait
                    self.log.warning("%s; retrying in %ss", exc, self.poll_interval)
                    await asyncio.sleep(self.poll_interval)
                    continue
                state = job["state"]
                if state in LIVE:
                    yield self._event("admitted", "admitted on " + ", ".join(
                        sorted({r["host"] for r in job["replicas"]})))
                    return
                if state == "preempting":   # the last admission is still stopping
                    await asyncio.sleep(self.poll_interval)
                    continue
                if state != "pending":
                    yield self._event(state, f"job {self.job_id} became {state} while "
                                      "waiting for admission")
                    return
                reason = (job.get("pending") or {}).get("reason")
                if reason != said:
                    eta = (job.get("pending") or {}).get("eta_seconds")
                    self.log.info("waiting for GPUs: %s%s", reason or "queued",
                                  f" (ETA {eta:.0f}s)" if eta is not None else "")
                    said = reason
                await asyncio.sleep(self.poll_interval)

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
