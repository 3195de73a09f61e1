"""Login for the plugin's pages and endpoints.

A FastAPI app mounted by a plugin gets no Airflow auth of its own, so every route depends
on `require_login`, which hands the request to Airflow's own `get_user`: the JWT from
`Authorization: Bearer` (API clients) or else the `_token` cookie the Airflow UI holds,
validated by the configured auth manager (signature, expiry, revocation). No token: 401;
an invalid token: 403; an expired one: 401.
"""

from __future__ import annotations

from fastapi import Request


async def require_login(request: Request):
    # Imported here: the plugin module is loaded by every Airflow process (workers,
    # triggerer), and the API server's security module pulls in the whole ORM.
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    return await get_user(request, None, await bearer_scheme(request))


def login_url(next_url: str) -> str:
    """Where the auth manager logs people in, coming back to `next_url`."""
    try:
        from airflow.api_fastapi.app import get_auth_manager

        return get_auth_manager().get_url_login(next_url=next_url)
    except Exception:          # no auth manager in this process (e.g. tests of the views)
        from urllib.parse import quote

        return f"/auth/login?next={quote(next_url, safe='/')}"
