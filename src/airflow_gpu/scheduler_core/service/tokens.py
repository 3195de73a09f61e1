"""Tokens through the API, for admins (`GET`, `POST`, `DELETE /api/v1/tokens?team=T`,
`DELETE /api/v1/tokens/{id}`): list them (never their secrets), create one (its secret is
answered once), revoke one or all of a team's, without access to the database.
`airflow-gpu token ... --db URL` does the same on the database directly (for the first
admin token)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import FastAPI, Path, Query
from pydantic import BaseModel, Field, field_validator, model_validator

from ..errors import InputError
from ..units import MAX_DURATION, Duration
from .app import Who  # app.py imports this module in create_app, not before
from .auth import (
    HOST_PATTERN,
    issue_token,
    list_tokens,
    revoke_team_token_rows,
    revoke_token_id,
    token_view,
)
from .core import Forbidden, Principal, Service, utcnow
from .schemas import _In

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"       # team names, as in the job spec


class TokenCreate(_In):
    team: str | None = Field(None, pattern=NAME, max_length=200, description="the team "
                             "it acts for (agent tokens: a label, default 'agents')")
    role: Literal["team", "admin", "agent"] = Field(
        "team", description="team: its team's jobs; admin: every team, hosts, quotas and "
        "tokens; agent: only register and report `hosts`")
    hosts: list[Annotated[str, Field(max_length=200, pattern=HOST_PATTERN.pattern)]] | None \
        = Field(None, min_length=1, max_length=1000, description="agent tokens: the host "
                "names or glob patterns ('dgx-*') it serves")
    allow_new_hosts: list[Annotated[str, Field(max_length=200,
                                               pattern=HOST_PATTERN.pattern)]] | None \
        = Field(None, min_length=1, max_length=1000, description="agent tokens: the host "
                "names or glob patterns of its `hosts` that it may add to the cluster; "
                "without it, it registers only hosts the cluster file lists")
    expires_in: Duration | None = Field(None, gt=0, description="refused after this long "
                                        "(30d, 12h, seconds); default never")
    expires_at: datetime | None = Field(None, description="refused from then on (ISO 8601; "
                                        "no zone: UTC)")

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, at: datetime | None) -> datetime | None:
        if at is None:
            return None
        try:
            return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
        except (OverflowError, ValueError):
            raise ValueError("out of range; give a time within the next 100 years") from None

    @model_validator(mode="after")
    def _consistent(self) -> TokenCreate:
        if self.expires_in is not None and self.expires_at is not None:
            raise ValueError("give expires_in or expires_at, not both")
        if (self.role == "agent") != (self.hosts is not None):
            raise ValueError("hosts: agent tokens (role agent) name their hosts, and only "
                             "they")
        if self.allow_new_hosts is not None and self.role != "agent":
            raise ValueError("allow_new_hosts: only agent tokens (role agent) register "
                             "hosts; give role agent and hosts, or leave it out")
        if self.role != "agent" and not self.team:
            raise ValueError(f"team: a {self.role} token needs a team")
        return self


class TokenOut(BaseModel):
    id: int
    team: str
    role: str
    hosts: list[str] | None = None
    allow_new_hosts: list[str] | None = Field(None, description="agent tokens: the hosts "
                                              "outside the cluster file it may add")
    created_at: datetime
    expires_at: datetime | None = None
    expired: bool = False
    hint: str | None = Field(None, description="the secret's last characters (agpu_...abcd), "
                             "to tell tokens apart; null for tokens made before 0009")


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: shown this once, stored only as a hash")


def _admin(p: Principal) -> None:
    if not p.admin:
        raise Forbidden(f"only admins list, create and revoke tokens; your token is team "
                        f"{p.team!r}'s")


def expiry(expires_in: int | None, expires_at: datetime | None) -> datetime | None:
    """When a new token expires: `expires_in` seconds from now, or `expires_at` (UTC)."""
    if expires_in is not None:
        return utcnow() + timedelta(seconds=expires_in)
    return expires_at


def create(service: Service, p: Principal, body: TokenCreate) -> dict:
    _admin(p)
    at, now = expiry(body.expires_in, body.expires_at), utcnow()
    if at is not None and at <= now:
        raise InputError(f"expires_at: {at.isoformat()} is not in the future; give a time "
                         "to come, or expires_in (30d)")
    if at is not None and at > now + timedelta(seconds=MAX_DURATION):
        raise InputError(f"expires_at: {at.isoformat()} is over 100 years away; give a "
                         "nearer time, or none (the token never expires)")
    token, row = issue_token(service.sessions, body.team, body.role == "admin",
                             body.hosts if body.role == "agent" else None, at,
                             body.allow_new_hosts)
    return {**token_view(row), "token": token}


def add_routes(app: FastAPI, service: Service) -> None:
    """The token routes (admin tokens; team tokens get 403, agent tokens too)."""

    @app.get("/api/v1/tokens", response_model=list[TokenOut])
    def tokens(p: Who,
               team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None):
        """Every token (of `team`): id, team, role, hosts, created_at, expires_at, expired
        and the secret's last characters; never the secret (admins)."""
        _admin(p)
        now = utcnow()
        return [token_view(r, now) for r in list_tokens(service.reads, team)]

    @app.post("/api/v1/tokens", status_code=201, response_model=TokenCreated)
    def create_token(body: TokenCreate, p: Who):
        """Create a token (admins); the answer holds its secret, this once."""
        return create(service, p, body)

    @app.delete("/api/v1/tokens/{token_id}", response_model=TokenOut)
    def revoke(token_id: Annotated[int, Path(ge=1, le=2**31 - 1)],
               p: Who):
        """Revoke a token (admins): refused by this replica at once, by every other one
        within auth.CACHE_SECONDS (1 s). Answers what it was."""
        _admin(p)
        return token_view(revoke_token_id(service.sessions, token_id))

    @app.delete("/api/v1/tokens", response_model=list[TokenOut])
    def revoke_team(team: Annotated[str, Query(max_length=200, pattern=NAME)],
                    p: Who):
        """Revoke every token of `team` (admins), in one transaction; answers what they
        were (an empty list: the team had none)."""
        _admin(p)
        return [token_view(r) for r in revoke_team_token_rows(service.sessions, team)]
