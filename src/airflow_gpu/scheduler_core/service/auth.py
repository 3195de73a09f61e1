"""Bearer tokens: each maps to a team (or is an admin's). Only a SHA-256 of a token is
stored; the token itself is shown once, when created."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ..store.models import TokenRow
from .core import Principal, utcnow

PREFIX = "agpu_"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(sessions: sessionmaker[Session], team: str, admin: bool = False) -> str:
    token = PREFIX + secrets.token_urlsafe(32)
    with sessions.begin() as s:
        s.add(TokenRow(token_hash=_hash(token), team=team, admin=admin, created_at=utcnow()))
    return token


_known: dict[str, tuple[float, Principal]] = {}
CACHE_SECONDS = 30.0


def principal_for(sessions: sessionmaker[Session], token: str) -> Principal | None:
    """Who holds `token`. Known tokens are remembered for 30 s (every request carries one);
    unknown ones are looked up each time."""
    digest = _hash(token)
    hit = _known.get(digest)
    if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    with sessions() as s:   # a read
        row = s.scalars(select(TokenRow).where(TokenRow.token_hash == digest)).first()
    if row is None:
        return None
    if len(_known) > 10_000:
        _known.clear()
    _known[digest] = (time.monotonic(), Principal(row.team, row.admin))
    return _known[digest][1]
