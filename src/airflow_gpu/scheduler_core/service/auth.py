"""Bearer tokens: each maps to a team (or is an admin's, or a node agent's). Only a SHA-256
of a token is stored; the token itself is shown once, when created.

Roles: a team token acts for its team, an admin token for every team and on hosts, an agent
token only registers and reports its own hosts (names or glob patterns stored with it).

A token is remembered in each process for at most CACHE_SECONDS after it was looked up, so
a revoked token is refused by every replica within CACHE_SECONDS (at once by the process
that revoked it)."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from fnmatch import fnmatchcase

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InputError
from ..store.models import TokenRow
from .core import Principal, utcnow

PREFIX = "agpu_"
ROLES = ("team", "admin", "agent")
AGENT_TEAM = "agents"           # the team an agent token is filed under unless given one
HOST_PATTERN = re.compile(r"^[A-Za-z0-9*?\[][A-Za-z0-9_.*?\[\]!-]*$")


@dataclass(frozen=True)
class AgentPrincipal(Principal):
    """A node agent's token: it may register and report the hosts that match `hosts`
    (names or fnmatch patterns, case-sensitive) and nothing else."""

    hosts: tuple[str, ...] = ()

    def may_act_for(self, team: str) -> bool:
        return False

    def serves(self, host: str) -> bool:
        return any(fnmatchcase(host, pattern) for pattern in self.hosts)

    def describe(self) -> str:
        return ", ".join(self.hosts)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(sessions: sessionmaker[Session], team: str | None, admin: bool = False,
                 hosts: list[str] | tuple[str, ...] | None = None) -> str:
    """A new token: a team's, an admin's (`admin`), or a node agent's (`hosts`: the host
    names or patterns it may register and report)."""
    if hosts is not None:
        if admin:
            raise InputError("--agent: an agent token cannot be an admin token too")
        hosts = list(dict.fromkeys(hosts))
        if not hosts:
            raise InputError("--host: an agent token needs at least one host name or "
                             "pattern (--host dgx-01, --host 'dgx-*')")
        for h in hosts:
            if len(h) > 200 or not HOST_PATTERN.match(h):
                raise InputError(f"--host: {h!r} is not a host name or glob pattern "
                                 "(letters, digits, '_', '.', '-', and *, ?, [...])")
        role, team = "agent", team or AGENT_TEAM
    else:
        if not team:
            raise InputError("--team: a team or admin token needs a team")
        role = "admin" if admin else "team"
    token = PREFIX + secrets.token_urlsafe(32)
    with sessions.begin() as s:
        s.add(TokenRow(token_hash=_hash(token), team=team, admin=admin, role=role,
                       hosts=hosts, created_at=utcnow()))
    return token


def revoke_token(sessions: sessionmaker[Session], token: str) -> bool:
    """Delete `token`; False if it is unknown. This process refuses it at once, other
    processes within CACHE_SECONDS."""
    digest = _hash(token)
    with sessions.begin() as s:
        gone = s.execute(delete(TokenRow).where(TokenRow.token_hash == digest)).rowcount
    _known.pop(digest, None)
    return bool(gone)


def revoke_team_tokens(sessions: sessionmaker[Session], team: str) -> int:
    """Delete every token of `team` (agent tokens filed under it too); how many."""
    with sessions.begin() as s:
        gone = s.execute(delete(TokenRow).where(TokenRow.team == team)).rowcount
    _known.clear()
    return gone


_known: dict[str, tuple[float, Principal]] = {}
CACHE_SECONDS = 1.0     # the bound on how long a revoked token keeps working (docs/service.md)


def _principal(row: TokenRow) -> Principal:
    if row.role == "agent":
        return AgentPrincipal(row.team, False, tuple(row.hosts or ()))
    return Principal(row.team, row.admin)


def principal_for(sessions: sessionmaker[Session], token: str) -> Principal | None:
    """Who holds `token`. Known tokens are remembered for CACHE_SECONDS (every request
    carries one); unknown ones are looked up each time."""
    digest = _hash(token)
    hit = _known.get(digest)
    if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    with sessions() as s:   # a read
        row = s.scalars(select(TokenRow).where(TokenRow.token_hash == digest)).first()
    if row is None:
        _known.pop(digest, None)
        return None
    if len(_known) > 10_000:
        _known.clear()
    _known[digest] = (time.monotonic(), _principal(row))
    return _known[digest][1]
