"""The scheduler-core connection (type `gpu_scheduler`) and its sync and async clients."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook, Connection

from ..scheduler_core.client import AsyncClient, Client

DEFAULT_PORT = 8080


def client_options(conn: Connection) -> dict[str, Any]:
    """URL, token and TLS settings of a `gpu_scheduler` connection.

    host and port name the service, the password holds the bearer token; `tls` (extra)
    switches to https and `verify` (extra) is false or a CA bundle path. A host given as
    a whole URL (http://... or https://...) is used as it is.
    """
    extra = conn.extra_dejson
    host = (conn.host or "127.0.0.1").rstrip("/")
    if "://" in host:
        url = host
    else:
        tls = extra.get("tls") in (True, "true", "True", "1") or conn.schema == "https"
        url = f"{'https' if tls else 'http'}://{host}:{conn.port or DEFAULT_PORT}"
    verify = extra.get("verify", True)
    if verify in ("false", "False", "0"):
        verify = False
    return {"url": url, "token": conn.password or None, "verify": verify,
            "timeout": float(extra.get("timeout", 30))}


class GpuSchedulerHook(BaseHook):
    """Talks to the airflow-provider-gpu scheduler-core service.

    :param gpu_scheduler_conn_id: a connection of type `gpu_scheduler`.
    """

    conn_name_attr = "gpu_scheduler_conn_id"
    default_conn_name = "gpu_scheduler_default"
    conn_type = "gpu_scheduler"
    hook_name = "GPU scheduler"

    def __init__(self, gpu_scheduler_conn_id: str = default_conn_name, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gpu_scheduler_conn_id = gpu_scheduler_conn_id

    def get_conn(self) -> Client:
        return Client(**client_options(self.get_connection(self.gpu_scheduler_conn_id)))

    async def aget_conn(self) -> AsyncClient:
        conn = await self.aget_connection(self.gpu_scheduler_conn_id)
        return AsyncClient(**client_options(conn))

    def test_connection(self) -> tuple[bool, str]:
        """Used by the UI's Test button: the token must be valid, not just the port open."""
        try:
            with self.get_conn() as c:
                c.teams()
        except Exception as exc:
            return False, str(exc)
        return True, "connected to the GPU scheduler"
