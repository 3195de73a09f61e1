"""Bearer tokens: each maps to a team (or is an admin's, or a node agent's). Only a SHA-256
of a token is stored; the token itself is shown once, when created.

Roles: a team token acts for its team, an admin token for every team and on hosts, an agent
token only registers and reports its own hosts (names or glob patterns stored with it).

A token may expire (`expires_at`): from then on it is refused (401, saying when it
expired), by every replica at once.

A token is remembered in each process for at most CACHE_SECONDS after it was looked up, so
a revoked token is refused by every replica within CACHE_SECONDS (at once by the process
that revoked it)."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InputError
from ..store.models import TokenRow
from .common import Principal, _ts, utcnow
from .errors import NotFound

PREFIX = "agpu_"
ROLES = ("team", "admin", "agent")
AGENT_TEAM = "agents"           # the team an agent token is filed under unless given one
HOST_PATTERN = re.compile(r"^[A-Za-z0-9*?\[][A-Za-z0-9_.*?\[\]!-]*$")
TEAM_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")     # as a job spec's team
HINT = 4                        # characters of the secret a token list shows (its end)


class TokenExpired(Exception):
    """The token is known but past its expiry (401, saying when)."""

    def __init__(self, at: datetime):
        self.at = at
        super().__init__(f"token expired at {_iso(at)}; ask an admin for a new one "
                         "(airflow-gpu token create)")


def _aware(at: datetime | None) -> datetime | None:
    """A stored time in UTC (SQLite gives UTC times back without a zone)."""
    if at is None:
        return None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _iso(at: datetime) -> str:
    return datetime.fromtimestamp(_ts(at), UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class AgentPrincipal(Principal):
    """A node agent's token: it may register and report the hosts that match `hosts`
    (names or fnmatch patterns, case-sensitive) and nothing else. Of these, it registers
    hosts the cluster file does not list (nor any registration) only where they also match
    `new_hosts`, which an admin gives it (--allow-new-hosts)."""

    hosts: tuple[str, ...] = ()
    new_hosts: tuple[str, ...] = ()
    token_id: int | None = None

    def may_act_for(self, team: str) -> bool:
        return False

    def serves(self, host: str) -> bool:
        return any(fnmatchcase(host, pattern) for pattern in self.hosts)

    def may_add(self, host: str) -> bool:
        return self.serves(host) and any(fnmatchcase(host, p) for p in self.new_hosts)

    def describe(self) -> str:
        return ", ".join(self.hosts)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(sessions: sessionmaker[Session], team: str | None, admin: bool = False,
                 hosts: list[str] | tuple[str, ...] | None = None,
                 expires_at: datetime | None = None,
                 new_hosts: list[str] | tuple[str, ...] | None = None,
                 user: str | None = None) -> str:
    """A new token: a team's (with `user`: a user's of the team), an admin's (`admin`),
    or a node agent's (`hosts`: the host names or patterns it may register and report;
    `new_hosts`: the names or patterns of those it may add to the cluster); refused from
    `expires_at` on."""
    return issue_token(sessions, team, admin, hosts, expires_at, new_hosts, user)[0]


def issue_token(sessions: sessionmaker[Session], team: str | None, admin: bool = False,
                hosts: list[str] | tuple[str, ...] | None = None,
                expires_at: datetime | None = None,
                new_hosts: list[str] | tuple[str, ...] | None = None,
                user: str | None = None) -> tuple[str, TokenRow]:
    """create_token, with the stored row (never holding the secret) besides the token."""
    new_hosts = _new_hosts(new_hosts, hosts)
    if user is not None:
        if hosts is not None:
            raise InputError("--user: an agent token is for hosts, not for a user; leave "
                             "--user out")
        check_team(user, "--user")
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
    check_team(team)
    now = utcnow()
    if expires_at is not None:
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        if expires_at <= now:
            raise InputError(f"--expires: {_iso(expires_at)} is not in the future; give "
                             "a time to come, or a duration such as 30d")
    token = PREFIX + secrets.token_urlsafe(32)
    row = TokenRow(token_hash=_hash(token), team=team, admin=admin, role=role,
                   hosts=hosts, allow_new_hosts=new_hosts, created_at=now,
                   expires_at=expires_at, hint=token[-HINT:], user=user)
    with sessions.begin() as s:
        s.add(row)
        s.flush()
        s.expunge(row)
    return token, row


def _new_hosts(patterns, hosts) -> list[str] | None:
    """--allow-new-hosts, checked: agent tokens only, names or glob patterns."""
    if not patterns:
        return None
    if hosts is None:
        raise InputError("--allow-new-hosts: only agent tokens register hosts; add --agent "
                         "and --host, or leave --allow-new-hosts out")
    patterns = list(dict.fromkeys(patterns))
    for p in patterns:
        if len(p) > 200 or not HOST_PATTERN.match(p):
            raise InputError(f"--allow-new-hosts: {p!r} is not a host name or glob pattern "
                             "(letters, digits, '_', '.', '-', and *, ?, [...])")
    return patterns


def check_team(team: str, flag: str = "--team") -> str:
    """A team (or user) name as a job spec takes it (letters, digits, '_', '.', '-'; 200
    at most)."""
    what = "user" if flag == "--user" else "team"
    if len(team) > 200 or not TEAM_PATTERN.match(team):
        raise InputError(f"{flag}: {team[:60]!r} is not a {what} name; use letters, digits, "
                         "'_', '.' and '-', starting with a letter or digit (200 at most), "
                         f"as a job spec's {what}")
    return team


def list_tokens(sessions: sessionmaker[Session], team: str | None = None) -> list[TokenRow]:
    """Every token (of `team`), oldest first; rows hold the secret's hash, never itself."""
    q = select(TokenRow).order_by(TokenRow.id)
    if team:
        q = q.where(TokenRow.team == team)
    with sessions() as s:
        return list(s.scalars(q))


def token_view(row: TokenRow, now: datetime | None = None) -> dict:
    """What a token list shows of a token: never the secret, nor its hash."""
    now = now or utcnow()
    role = row.role or ("admin" if row.admin else "team")
    return {"id": row.id, "team": row.team, "role": role, "user": row.user,
            "hosts": list(row.hosts or []) if role == "agent" else None,
            "allow_new_hosts": list(row.allow_new_hosts or []) if role == "agent" else None,
            "created_at": _aware(row.created_at), "expires_at": _aware(row.expires_at),
            "expired": row.expires_at is not None and _ts(row.expires_at) <= _ts(now),
            "hint": f"{PREFIX}...{row.hint}" if row.hint else None}


def revoke_token_id(sessions: sessionmaker[Session], token_id: int) -> TokenRow:
    """Delete the token with this id (as `token list` shows it); NotFound if there is none.
    This process refuses it at once, other processes within CACHE_SECONDS."""
    with sessions.begin() as s:
        row = s.get(TokenRow, token_id)
        if row is None:
            raise NotFound(f"token {token_id} does not exist (already revoked? airflow-gpu "
                           "token list shows the tokens)")
        s.delete(row)         # detached after the commit, its fields kept
    _known.pop(row.token_hash, None)
    return row


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


def revoke_team_token_rows(sessions: sessionmaker[Session], team: str) -> list[TokenRow]:
    """revoke_team_tokens, answering the rows deleted (in one transaction)."""
    with sessions.begin() as s:
        rows = list(s.scalars(select(TokenRow).where(TokenRow.team == team)
                              .order_by(TokenRow.id)))
        for row in rows:
            s.delete(row)     # detached after the commit, their fields kept
    for row in rows:
        _known.pop(row.token_hash, None)
    return rows


_known: dict[str, tuple[float, Principal, float | None]] = {}
CACHE_SECONDS = 1.0     # the bound on how long a revoked token keeps working (docs/service.md)


def _principal(row: TokenRow) -> Principal:
    if row.role == "agent":
        return AgentPrincipal(row.team, False, hosts=tuple(row.hosts or ()),
                              new_hosts=tuple(row.allow_new_hosts or ()), token_id=row.id)
    return Principal(row.team, row.admin, getattr(row, "user", None))


def remembered(token: str) -> Principal | None:
    """Who holds `token` if this process looked it up less than CACHE_SECONDS ago (no
    database, so the event loop may ask); None when it must be looked up; TokenExpired
    past its expiry."""
    hit = _known.get(_hash(token))
    if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
        return _unexpired(hit[1], hit[2])
    return None


def principal_for(sessions: sessionmaker[Session], token: str) -> Principal | None:
    """Who holds `token` (None: no such token); TokenExpired past its expiry. Known tokens
    are remembered for CACHE_SECONDS (every request carries one); unknown ones are looked
    up each time."""
    known = remembered(token)
    if known is not None:
        return known
    digest = _hash(token)
    with sessions() as s:   # a read
        row = s.scalars(select(TokenRow).where(TokenRow.token_hash == digest)).first()
    if row is None:
        _known.pop(digest, None)
        return None
    if len(_known) > 10_000:
        _known.clear()
    expires = _ts(row.expires_at) if row.expires_at is not None else None
    _known[digest] = (time.monotonic(), _principal(row), expires)
    return _unexpired(_known[digest][1], expires)


def _unexpired(p: Principal, expires: float | None) -> Principal:
    if expires is not None and time.time() >= expires:
        raise TokenExpired(datetime.fromtimestamp(expires, UTC))
    return p
