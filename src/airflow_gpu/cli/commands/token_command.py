"""`airflow-gpu token list | create | revoke`: through the API with an admin token
(`--url` / `--token` as the other client commands), or on the database directly with
`--db URL` (to create the first admin token)."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime

from rich.table import Table

from ...scheduler_core.errors import InputError
from ...scheduler_core.units import parse_duration
from ..common import api_client, console


def expires(value: str | None) -> tuple[int | None, datetime | None]:
    """--expires: a duration from now (`30d`, `12h`, seconds) or a time (ISO 8601, UTC
    unless it says); (seconds, None) or (None, time)."""
    if value is None:
        return None, None
    try:
        seconds = parse_duration(value)
    except ValueError:
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            raise InputError(f"--expires: {value!r} is neither a duration (30d, 12h, 90m) "
                             "nor a time (2027-01-31 or 2027-01-31T12:00:00+00:00)") from None
        at = at if at.tzinfo else at.replace(tzinfo=UTC)
        if at <= datetime.now(UTC):          # a token dead on arrival is surely a typo
            raise InputError(f"--expires: {value!r} is in the past (now "
                             f"{datetime.now(UTC):%Y-%m-%dT%H:%M}Z); give a later time or "
                             "a duration such as 30d") from None
        return None, at
    if seconds <= 0:
        raise InputError(f"--expires: {value!r} is no time at all; give a duration such "
                         "as 30d")
    return seconds, None


def _expires_at(args: argparse.Namespace) -> datetime | None:
    from datetime import timedelta

    seconds, at = expires(args.expires)
    if seconds is not None:
        return datetime.now(UTC) + timedelta(seconds=seconds)
    return at


def _role(args: argparse.Namespace) -> str:
    return "agent" if args.agent else "admin" if args.admin else "team"


def cmd_token_create(args: argparse.Namespace) -> int:
    """`token create`: on the database with --db, else through the API."""
    expiry = expires(args.expires)          # bad input fails before anything else
    if args.db:
        args.expires_at = _expires_at(args)
        return _db_create(args)
    check_token_args(args)
    seconds, at = expiry
    with api_client(args) as c:
        made = c.create_token(args.team, _role(args), args.host if args.agent else None,
                              seconds, at.isoformat() if at else None,
                              args.allow_new_hosts, args.user)
    print(json.dumps(made, indent=2) if args.json else made["token"])
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    """`token revoke ID | TOKEN | --team T`: on the database with --db (a token by its
    secret through `_db_revoke`), else through the API (by id)."""
    from ...scheduler_core.service.auth import CACHE_SECONDS

    target = args.target
    if bool(target) == bool(args.team):
        raise InputError("token revoke: give the token's id (airflow-gpu token list), "
                         "or --team T for all of a team's tokens")
    by_id = bool(target) and target.isascii() and target.isdigit()
    if target and not by_id and not args.db:
        raise InputError("token revoke: that is not a token id; through the API a token "
                         "is revoked by its id (airflow-gpu token list shows them), by "
                         "the token itself only with --db URL")
    check_team(args.team)
    if args.db and not by_id:
        args.token = target                 # the secret, or None with --team
        return _db_revoke(args)
    if args.db:
        gone = [_db_revoke_id(args, int(target))]
    else:
        with api_client(args) as c:
            gone = ([c.revoke_token(int(target))] if target
                    else c.revoke_team_tokens(args.team))
    if args.json:
        print(json.dumps(gone, indent=2, default=str))
        return 0
    n = len(gone)
    print(f"revoked {n} token{'' if n == 1 else 's'}"
          + (f" ({', '.join(_describe(t) for t in gone)})" if gone else "")
          + f"; the service refuses {'it' if n == 1 else 'them'} within "
          f"{CACHE_SECONDS:g} s")
    return 0


def check_team(team: str | None, what: str = "--team") -> None:
    """A team name as job specs and the API take it (jobspec's team field)."""
    from ...scheduler_core.jobspec import _NAME, MAX_TEXT

    if team is not None and not (re.fullmatch(_NAME.strip("^$"), team)
                                 and len(team) <= MAX_TEXT):
        shown = repr(team) if len(team) <= 60 else repr(f"{team[:57]}...")
        raise InputError(f"{what}: {shown} is not a team name; use letters, digits, '_', "
                         f"'.' and '-', starting with a letter or digit, at most {MAX_TEXT} "
                         "characters (as job specs name teams)")


def check_token_args(args: argparse.Namespace) -> None:
    """The role flags of `token create` (through the API or the database) fit together."""
    if args.agent and not args.host:
        raise InputError("--agent: name the host(s) the agent token is for: --host NAME "
                         "(repeat it, or a glob pattern such as --host 'dgx-*')")
    if args.host and not args.agent:
        raise InputError("--host: only agent tokens are for hosts; add --agent")
    if getattr(args, "allow_new_hosts", None) and not args.agent:
        raise InputError("--allow-new-hosts: only agent tokens register hosts; add --agent "
                         "and --host")
    if not args.agent and not args.team:
        raise InputError("--team: a team or admin token needs a team (--team T)")
    check_team(args.team)


def _db_create(args: argparse.Namespace) -> int:
    from ...scheduler_core.service.auth import create_token
    from ...scheduler_core.store.db import database_errors, open_database, sessions, upgrade

    check_token_args(args)
    engine = open_database(args.db, create=args.create)
    try:
        with database_errors(args.db):
            upgrade(engine)
            token = create_token(sessions(engine), args.team, args.admin,
                                 args.host if args.agent else None,
                                 expires_at=getattr(args, "expires_at", None),  # --expires
                                 new_hosts=getattr(args, "allow_new_hosts", None),
                                 user=getattr(args, "user", None))
    finally:
        engine.dispose()
    print(token)
    return 0


def _db_revoke(args: argparse.Namespace) -> int:
    from ...scheduler_core.service.auth import CACHE_SECONDS, revoke_team_tokens, revoke_token
    from ...scheduler_core.store.db import database_errors, open_database, sessions, upgrade

    if bool(args.token) == bool(args.team):
        raise InputError("token revoke: give the token, or --team T for all of a team's "
                         "tokens")
    check_team(args.team)
    engine = open_database(args.db, create=args.create)
    try:
        with database_errors(args.db):
            upgrade(engine)
            if args.token:
                if not revoke_token(sessions(engine), args.token):
                    raise InputError("token revoke: no such token (already revoked?)")
                gone = 1
            else:
                gone = revoke_team_tokens(sessions(engine), args.team)
    finally:
        engine.dispose()
    print(f"revoked {gone} token{'' if gone == 1 else 's'}; the service refuses "
          f"{'it' if gone == 1 else 'them'} within {CACHE_SECONDS:g} s")
    return 0


def _db_revoke_id(args: argparse.Namespace, token_id: int) -> dict:
    from ...scheduler_core.service.auth import revoke_token_id, token_view
    from ...scheduler_core.service.core import NotFound
    from ...scheduler_core.store.db import database_errors, open_database, sessions, upgrade

    engine = open_database(args.db, create=args.create)
    try:
        with database_errors(args.db):
            upgrade(engine)
            try:
                return token_view(revoke_token_id(sessions(engine), token_id))
            except NotFound as exc:
                raise InputError(f"token revoke: {exc}") from None
    finally:
        engine.dispose()


def _describe(t: dict) -> str:
    return f"id {t['id']}, {t['role']} token of team {t['team']}"


def cmd_token_list(args: argparse.Namespace) -> int:
    """`token list`: every token (of --team), never the secrets."""
    check_team(args.team)
    if args.db:
        from ...scheduler_core.service.auth import list_tokens, token_view
        from ...scheduler_core.store.db import database_errors, open_database, sessions, upgrade

        engine = open_database(args.db, create=None)
        try:
            with database_errors(args.db):
                upgrade(engine)
                tokens = [token_view(r) for r in list_tokens(sessions(engine), args.team)]
        finally:
            engine.dispose()
    else:
        with api_client(args) as c:
            tokens = c.tokens(args.team)
    if args.json:
        print(json.dumps(tokens, indent=2, default=str))
    else:
        console().print(_tokens_table(tokens))
    return 0


def _tokens_table(tokens: list[dict]) -> Table:
    t = Table(title="Tokens", title_justify="left")
    for col in ("id", "team", "role", "hosts", "created", "expires", "token"):
        t.add_column(col, overflow="fold")
    for x in tokens:
        exp = _when(x.get("expires_at"))
        if x.get("expired"):
            exp += " (expired)"
        hosts = ", ".join(x.get("hosts") or []) or "-"
        if x.get("allow_new_hosts"):
            hosts += f" (may add {', '.join(x['allow_new_hosts'])})"
        role = x["role"] + (f" (user {x['user']})" if x.get("user") else "")
        t.add_row(str(x["id"]), x["team"], role, hosts,
                  _when(x.get("created_at")), exp if x.get("expires_at") else "never",
                  x.get("hint") or "-")
    return t


def _when(at) -> str:
    if at is None:
        return "-"
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def add_commands(sub, client: argparse.ArgumentParser) -> None:
    """The `token` commands; `client`: the client commands' parent parser (--url, --token,
    --conn-id, --json)."""
    def db(p: argparse.ArgumentParser, create: bool = True) -> None:
        p.add_argument("--db", help="work on this database directly (SQLAlchemy URL: "
                       "sqlite:///FILE or postgresql+psycopg://...) instead of through the "
                       "API: for the first admin token")
        if create:
            p.add_argument("--create", action="store_true",
                           help="with --db, SQLite: create the database file when it does "
                           "not exist (else refused, so a mistyped path does not start an "
                           "empty database)")

    tok = sub.add_parser("token", help="API tokens: list, create, revoke (admin token, or "
                         "--db URL)")
    tsub = tok.add_subparsers(dest="token_command", required=True)
    tl = tsub.add_parser("list", parents=[client], help="every token: id, team, role, "
                         "hosts, created, expires and its last characters (never the secret)")
    tl.add_argument("--team", help="only this team's tokens")
    db(tl, create=False)
    tl.set_defaults(func=cmd_token_list)
    tc = tsub.add_parser("create", parents=[client], help="create a token for a team, an "
                         "admin or a node agent; prints it once")
    tc.add_argument("--team", help="the team the token acts for (agent tokens: default "
                    "'agents', a label only)")
    tc.add_argument("--admin", action="store_true", help="may drain hosts and act for any team")
    tc.add_argument("--user", help="a user's token of the team: its jobs are that user's "
                    "(fair share within the team, acct --by user), and it cancels, holds "
                    "or updates only those")
    tc.add_argument("--agent", action="store_true",
                    help="a node agent's token: it may only register and report the --host "
                    "hosts (no jobs, teams or admin routes)")
    tc.add_argument("--host", action="append", metavar="NAME",
                    help="with --agent: a host the token is for, or a glob pattern "
                    "('dgx-*'); repeat for several")
    tc.add_argument("--allow-new-hosts", action="append", metavar="PATTERN",
                    help="with --agent: let it add hosts the cluster file does not list, "
                    "those of its --host hosts whose names match PATTERN ('dgx-9*'); "
                    "repeat for several; without it the token registers only the cluster "
                    "file's hosts")
    tc.add_argument("--expires", metavar="WHEN", help="refused after this long (30d, 12h) "
                    "or from this time on (2027-01-31, ISO 8601, UTC unless it says); "
                    "default never")
    db(tc)
    tc.set_defaults(func=cmd_token_create)
    tr = tsub.add_parser("revoke", parents=[client], help="delete a token (or all of a "
                         "team's); the service refuses it within a second")
    tr.add_argument("target", nargs="?", metavar="ID",
                    help="the token's id (token list); with --db also the token itself")
    tr.add_argument("--team", help="revoke every token of this team instead")
    db(tr)
    tr.set_defaults(func=cmd_token_revoke)
