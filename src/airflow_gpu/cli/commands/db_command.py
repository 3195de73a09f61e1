"""`airflow-gpu db upgrade` (create or migrate the schema), `db check` and `db repair`:
the hold rows that disagree with the allocations (scheduler_core/store/integrity.py),
listed a line each, and deleted. What such a row holds is quarantined by every
scheduling pass until it is repaired."""

from __future__ import annotations

import argparse
import contextlib
import sys

from ..common import db_arg


def add_commands(sub) -> None:
    d = sub.add_parser("db", help="the service's database")
    dsub = d.add_subparsers(dest="db_command", required=True)
    du = dsub.add_parser("upgrade", help="create or migrate the schema (idempotent)")
    db_arg(du)
    du.set_defaults(func=cmd_db_upgrade)
    for name, func, helptext in (
            ("check", cmd_db_check, "list hold rows that disagree with the allocations "
             "(exit 1 when there is one)"),
            ("repair", cmd_db_repair, "delete the hold rows `db check` lists (what they "
             "hold is quarantined until then)")):
        p = dsub.add_parser(name, help=helptext)
        db_arg(p)
        p.add_argument("--cluster", help="the server's cluster file (or built-in name): "
                       "holds of GPUs, cores or MIG devices its hosts do not have are "
                       "found too")
        if name == "repair":
            p.add_argument("--dry-run", action="store_true",
                           help="print what would be deleted; change nothing")
        p.set_defaults(func=func)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from ...scheduler_core.store.db import (
        current_revision,
        database_errors,
        open_database,
        upgrade,
    )

    engine = open_database(args.db, create=True)      # creates a SQLite file, not a folder
    try:
        with database_errors(args.db):
            upgrade(engine)
            revision = current_revision(engine)
    finally:
        engine.dispose()
    print(f"database at revision {revision} ({engine.url!r})")
    return 0


def _cluster(s, path: str | None):
    """The cluster the server schedules: the file's hosts with the models node agents
    registered (as service/agents.py composes it)."""
    if not path:
        return None
    from sqlalchemy import select

    from ...scheduler_core.engine.cluster import load_cluster
    from ...scheduler_core.engine.topology import Topology
    from ...scheduler_core.service.agents import compose
    from ...scheduler_core.store.models import HostRow

    rows = s.execute(select(HostRow.name, HostRow.topology_hash, HostRow.rack,
                            HostRow.switch, HostRow.docker_url, HostRow.address,
                            HostRow.labels).where(HostRow.topology_hash.is_not(None))
                     .order_by(HostRow.name)).all()
    models = {}
    for h, doc in s.execute(select(HostRow.topology_hash, HostRow.topology).where(
            HostRow.topology_hash.is_not(None))):
        with contextlib.suppress(ValueError):      # a model the server cannot use either
            models.setdefault(h, Topology.model_validate(doc))
    return compose(load_cluster(path), rows, models)


def _run(args: argparse.Namespace, repair: bool) -> int:
    from ...scheduler_core.errors import InputError
    from ...scheduler_core.store import integrity
    from ...scheduler_core.store.db import (
        current_revision,
        database_errors,
        open_database,
        sessions,
        shown_url,
    )

    engine = open_database(args.db, create=None)
    try:
        with database_errors(args.db):
            if current_revision(engine) is None:
                raise InputError(f"--db: {shown_url(args.db)} holds no airflow-gpu "
                                 "schema; point --db at the server's database (or create "
                                 f"one: airflow-gpu db upgrade --db {shown_url(args.db)})")
        with database_errors(args.db), sessions(engine).begin() as s:
            found = integrity.find(s, _cluster(s, args.cluster), exact=True)
            if not repair:
                for f in found:
                    print(f.line())
            else:
                done = integrity.repair(s, found)
                prefix = "would have " if args.dry_run else ""
                for line in done:
                    print(prefix + line)
                for f in found:
                    if not f.repairable:
                        print(f"left: {f.line()}")
                if args.dry_run:
                    s.rollback()
    finally:
        engine.dispose()
    checked = "" if args.cluster else \
        " (indexes not checked against the hosts: add --cluster FILE, the server's)"
    left = [f for f in found if not (repair and f.repairable)]
    if not found:
        print(f"no wrong hold rows in gpu_holds, cpu_holds or mig_holds{checked}",
              file=sys.stderr)
    elif not repair:
        fixable = sum(f.repairable for f in found)
        print(f"{len(found)} wrong hold row{'s' if len(found) != 1 else ''}; "
              f"`airflow-gpu db repair --db URL` deletes {fixable} of them{checked}",
              file=sys.stderr)
    elif args.dry_run:
        print(f"dry run: nothing was changed; run it without --dry-run to delete "
              f"{len(found) - len(left)} row(s)", file=sys.stderr)
    else:
        print(f"deleted {len(found) - len(left)} row(s); the next scheduling pass "
              "gives what they held work again", file=sys.stderr)
    return 1 if left or (repair and args.dry_run and found) else 0


def cmd_db_check(args: argparse.Namespace) -> int:
    return _run(args, repair=False)


def cmd_db_repair(args: argparse.Namespace) -> int:
    return _run(args, repair=True)
