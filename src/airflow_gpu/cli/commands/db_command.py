"""`airflow-gpu db upgrade` (create or migrate the schema), `db check` and `db repair`:
the hold rows that disagree with the allocations, and the allocations that disagree with
their jobs and hosts (scheduler_core/store/integrity.py), listed a line each, read in one
snapshot, and fixed (store/repair.py). What a wrong hold row holds is quarantined by
every scheduling pass until it is repaired."""

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
            ("check", cmd_db_check, "list hold rows that disagree with the allocations, "
             "and allocations that disagree with their jobs and hosts (exit 1 when there "
             "is one)"),
            ("repair", cmd_db_repair, "fix what `db check` lists that can be told apart: "
             "delete wrong hold rows, mark allocations of ended jobs not live, rewrite "
             "allocations naming devices the host lacks (needs --cluster)")):
        p = dsub.add_parser(name, help=helptext)
        db_arg(p)
        p.add_argument("--cluster", help="the server's cluster file (or built-in name): "
                       "rows naming GPUs, cores or MIG devices its hosts do not have are "
                       "found too")
        if name == "repair":
            p.add_argument("--dry-run", action="store_true",
                           help="print what would be changed; change nothing")
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
    from ...scheduler_core.store import repair as fix
    from ...scheduler_core.store.db import (
        current_revision,
        database_errors,
        open_database,
        shown_url,
    )

    engine = open_database(args.db, create=None)
    try:
        with database_errors(args.db):
            if current_revision(engine) is None:
                raise InputError(f"--db: {shown_url(args.db)} holds no airflow-gpu "
                                 "schema; point --db at the server's database (or create "
                                 f"one: airflow-gpu db upgrade --db {shown_url(args.db)})")
        with database_errors(args.db):
            def cluster_of(s):
                return _cluster(s, args.cluster)
            if repair:
                out = fix.repair(engine, cluster_of, dry_run=args.dry_run)
                found, left = out.found, out.left
            else:
                found = left = fix.check(engine, cluster_of)
    finally:
        engine.dispose()
    checked = "" if args.cluster else \
        " (devices not checked against the hosts: add --cluster FILE, the server's)"
    if not repair:
        for f in found:
            print(f.line())
        if not found:
            print(f"no wrong rows in gpu_holds, cpu_holds, mig_holds or allocations{checked}",
                  file=sys.stderr)
        else:
            fixable = sum(f.repairable for f in found)
            print(f"{len(found)} wrong row{'s' if len(found) != 1 else ''}; "
                  f"`airflow-gpu db repair --db URL` fixes {fixable} of them{checked}",
                  file=sys.stderr)
        return 1 if found else 0
    prefix = "would have " if args.dry_run else ""
    for line in out.done:
        print(prefix + line)
    for f in left:
        print(f"left: {f.line()}")
    if not found:
        print(f"no wrong rows in gpu_holds, cpu_holds, mig_holds or allocations{checked}",
              file=sys.stderr)
    elif args.dry_run:
        print(f"dry run: nothing was changed; without --dry-run: {out.summary()}",
              file=sys.stderr)
    else:
        print(f"{out.summary()}; {len(left)} wrong row(s) left; the next scheduling pass "
              "gives what the deleted rows held work again", file=sys.stderr)
    return 1 if left or (args.dry_run and found) else 0


def cmd_db_check(args: argparse.Namespace) -> int:
    return _run(args, repair=False)


def cmd_db_repair(args: argparse.Namespace) -> int:
    return _run(args, repair=True)
