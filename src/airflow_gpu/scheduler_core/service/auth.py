"""Bearer tokens: each maps to a team (or is an admin's). Only a SHA-256 of a token is
stored; the token itself is shown once, when created."""

from __future__ import annotations

import hashlib
import secrets

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


def principal_for(sessions: sessionmaker[Session], token: str) -> Principal | None:
    with sessions() as s:   # a read
        row = s.scalars(select(TokenRow).where(TokenRow.token_hash == _hash(token))).first()
    return Principal(row.team, row.admin) if row else None
