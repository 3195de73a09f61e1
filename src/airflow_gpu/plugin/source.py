"""The scheduler-core as the plugin reads it: GETs through the `gpu_scheduler`
connection's hook (its host, port and token), with a short cache so many open pages cost
the scheduler one read per endpoint every few seconds."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..hooks.scheduler import GpuSchedulerHook
from ..scheduler_core.client import ApiError, Client
from ..scheduler_core.errors import InputError

CACHE_SECONDS = 2.0          # answers reused across pages and viewers
CLIENT_SECONDS = 30.0        # how long a connection (token) is reused before re-reading it


def conn_id() -> str:
    """`[gpu_scheduler] ui_conn_id` (AIRFLOW__GPU_SCHEDULER__UI_CONN_ID), else the default."""
    from airflow.configuration import conf

    return conf.get("gpu_scheduler", "ui_conn_id",
                    fallback=GpuSchedulerHook.default_conn_name) or \
        GpuSchedulerHook.default_conn_name


class SourceError(Exception):
    """The scheduler could not answer; `status` is what the plugin answers in turn."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class SchedulerSource:
    def __init__(self, conn: str | None = None):
        self._conn = conn
        self._lock = threading.Lock()
        self._client: tuple[float, Client] | None = None
        self._cache: dict[tuple, tuple[float, Any]] = {}

    @property
    def conn_id(self) -> str:
        return self._conn or conn_id()

    def _get_client(self) -> Client:
        with self._lock:
            if self._client and time.monotonic() - self._client[0] < CLIENT_SECONDS:
                return self._client[1]
        try:
            client = GpuSchedulerHook(self.conn_id).get_conn()
        except Exception as exc:      # AirflowNotFoundException and friends
            raise SourceError(503, f"connection {self.conn_id!r}: {exc}. Create it (type "
                              "gpu_scheduler; host, port, and a token from `airflow-gpu "
                              "token create --team T` as password) or name another one in "
                              "[gpu_scheduler] ui_conn_id") from None
        with self._lock:        # a replaced client may still serve a request: not closed
            self._client = (time.monotonic(), client)
        return client

    def get(self, path: str, **params: Any) -> Any:
        key = (path, tuple(sorted(params.items())))
        with self._lock:
            hit = self._cache.get(key)
            if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
                return hit[1]
        client = self._get_client()
        try:
            value = client.request("GET", path, params={k: v for k, v in params.items()
                                                        if v is not None})
        except InputError as exc:                 # unreachable
            self._client = None
            raise SourceError(502, f"{exc} (connection {self.conn_id!r})") from None
        except ApiError as exc:
            if exc.status == 404:
                raise SourceError(404, str(exc.detail)) from None
            if exc.status in (401, 403):
                self._client = None
                raise SourceError(502, f"the scheduler refused the token of connection "
                                  f"{self.conn_id!r} ({exc.detail}); put a valid token in "
                                  "its password") from None
            raise SourceError(502, f"the scheduler answered {exc}") from None
        with self._lock:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = (time.monotonic(), value)
        return value

    # -- what the pages read -----------------------------------------------------------------
    def cluster(self) -> dict:
        return self.get("/api/v1/cluster")

    def jobs(self, state: str | None = None, newest: bool = False,
             limit: int = 1000) -> list[dict]:
        return self.get("/api/v1/jobs", state=state, limit=limit,
                        order="newest" if newest else None)

    def queue(self) -> list[dict]:
        """The pending jobs in the order the scheduler considers them (`rank`; held jobs
        and those it does not queue last, rank None), as `airflow-gpu queue` lists them."""
        return self.get("/api/v1/queue", state="pending", limit=10_000)

    def live_jobs(self) -> list[dict]:
        return self.jobs("admitted") + self.jobs("running") + self.jobs("preempting")

    def job(self, job_id: str) -> dict:
        return self.get(f"/api/v1/jobs/{job_id}")

    def usage(self, job_id: str) -> dict:
        """GPU-hours, utilization, energy and the utilization series of one job (404 from
        a service older than accounting)."""
        return self.get(f"/api/v1/jobs/{job_id}/usage")

    def explain(self, job_id: str) -> dict:
        return self.get(f"/api/v1/jobs/{job_id}/explain")

    def teams(self) -> list[dict]:
        return self.get("/api/v1/teams")
