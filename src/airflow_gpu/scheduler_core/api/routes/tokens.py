"""Tokens, for admins (team and agent tokens get 403): list them (never their secrets),
create one (its secret answered once), revoke one or all of a team's (service/tokens.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from ...service.auth import list_tokens, revoke_team_token_rows, revoke_token_id, token_view
from ...service.common import utcnow
from ...service.tokens import admin_only, create
from ..bodies import DecodedOffLoop
from ..deps import Svc, Who
from ..models.base import NAME
from ..models.tokens import TokenCreate, TokenCreated, TokenOut

router = APIRouter(route_class=DecodedOffLoop)


@router.get("/api/v1/tokens", response_model=list[TokenOut])
def tokens(p: Who, service: Svc,
           team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None):
    """Every token (of `team`): id, team, role, hosts, created_at, expires_at, expired
    and the secret's last characters; never the secret (admins)."""
    admin_only(p)
    now = utcnow()
    return [token_view(r, now) for r in list_tokens(service.reads, team)]


@router.post("/api/v1/tokens", status_code=201, response_model=TokenCreated)
def create_token(body: TokenCreate, p: Who, service: Svc):
    """Create a token (admins); the answer holds its secret, this once."""
    return create(service, p, body.team, body.role, body.hosts, body.allow_new_hosts,
                  body.expires_in, body.expires_at, body.user)


@router.delete("/api/v1/tokens/{token_id}", response_model=TokenOut)
def revoke(token_id: Annotated[int, Path(ge=1, le=2**31 - 1)], p: Who, service: Svc):
    """Revoke a token (admins): refused by this replica at once, by every other one
    within auth.CACHE_SECONDS (1 s). Answers what it was."""
    admin_only(p)
    return token_view(revoke_token_id(service.sessions, token_id))


@router.delete("/api/v1/tokens", response_model=list[TokenOut])
def revoke_team(team: Annotated[str, Query(max_length=200, pattern=NAME)], p: Who,
                service: Svc):
    """Revoke every token of `team` (admins), in one transaction; answers what they
    were (an empty list: the team had none)."""
    admin_only(p)
    return [token_view(r) for r in revoke_team_token_rows(service.sessions, team)]
