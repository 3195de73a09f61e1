"""Tokens through the API, for admins (`GET`, `POST`, `DELETE /api/v1/tokens?team=T`,
`DELETE /api/v1/tokens/{id}`: api/routes/tokens.py): list them (never their secrets),
create one (its secret is answered once), revoke one or all of a team's, without access to
the database. `airflow-gpu token ... --db URL` does the same on the database directly
(for the first admin token)."""

from __future__ import annotations

from datetime import datetime, timedelta

from ..errors import InputError
from ..units import MAX_DURATION
from .auth import issue_token, token_view
from .common import Principal, utcnow
from .core import Service
from .errors import Forbidden


def admin_only(p: Principal) -> None:
    if not p.admin:
        raise Forbidden(f"only admins list, create and revoke tokens; your token is team "
                        f"{p.team!r}'s")


def expiry(expires_in: int | None, expires_at: datetime | None) -> datetime | None:
    """When a new token expires: `expires_in` seconds from now, or `expires_at` (UTC)."""
    if expires_in is not None:
        return utcnow() + timedelta(seconds=expires_in)
    return expires_at


def create(service: Service, p: Principal, team: str | None, role: str,
           hosts: list[str] | None, allow_new_hosts: list[str] | None,
           expires_in: int | None, expires_at: datetime | None,
           user: str | None = None) -> dict:
    """A new token of `role` (team, admin or agent), as an admin asks; its entry and
    `token`, the secret."""
    admin_only(p)
    at, now = expiry(expires_in, expires_at), utcnow()
    if at is not None and at <= now:
        raise InputError(f"expires_at: {at.isoformat()} is not in the future; give a time "
                         "to come, or expires_in (30d)")
    if at is not None and at > now + timedelta(seconds=MAX_DURATION):
        raise InputError(f"expires_at: {at.isoformat()} is over 100 years away; give a "
                         "nearer time, or none (the token never expires)")
    token, row = issue_token(service.sessions, team, role == "admin",
                             hosts if role == "agent" else None, at, allow_new_hosts, user)
    return {**token_view(row), "token": token}
