"""`airflow-gpu cancel`, as Slurm's scancel: jobs by reference (an id, a prefix, a name, an
array: each of its elements; `NAME_3`: one element) at once, or by filters (`--team`,
`--state`, `--name`; with references, all must hold) after saying how many match and
asking on a terminal (`--yes`: without asking; no terminal and no `--yes`: exit 2). The
service matches only the token's team's jobs (an admin's: any), and cancels exactly what
the question showed, nothing submitted since (POST /api/v1/jobs/cancel, dry_run)."""

from __future__ import annotations

import argparse
import json
import sys

from ...scheduler_core.errors import InputError
from ..common import api_client
from .status_view import label

CANCELLABLE = ("pending", "admitted", "running", "preempting")
SHOWN = 5          # jobs named before the question


def _line(j: dict, state: str) -> str:
    return f"job {j['id']} ({label(j)}, team {j['team']}): {state}"


def _check(args: argparse.Namespace) -> None:
    if not (args.jobs or args.team or args.state or args.name or args.user):
        raise InputError("cancel: give a job (id, id prefix, name or array; NAME_3 for one "
                         "element) or a filter (--team, --user, --state, --name); nothing was "
                         "cancelled")
    if args.state is not None and args.state not in CANCELLABLE:
        raise InputError(f"--state: {args.state!r} is no state a job can be cancelled in; "
                         f"use one of {', '.join(CANCELLABLE)}")


def _ask(count: int) -> bool:
    sys.stderr.write(f"Cancel {'this job' if count == 1 else f'these {count} jobs'}? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def cmd_cancel(args: argparse.Namespace) -> int:
    _check(args)
    filters = {"team": args.team, "state": args.state, "name": args.name, "user": args.user}
    with api_client(args) as c:
        as_of = None
        if any(filters.values()):           # by filters: say what matches, then ask
            shown = c.cancel_jobs(args.jobs, dry_run=True, **filters)
            if not shown["count"]:
                print("no job matches: nothing was cancelled", file=sys.stderr)
                return 0
            names = ", ".join(f"{label(j)} ({j['id'][:8]})" for j in shown["jobs"][:SHOWN])
            more = shown["count"] - min(SHOWN, len(shown["jobs"]))
            print(f"{shown['count']} job{'s' if shown['count'] != 1 else ''} match: {names}"
                  + (f" and {more} more" if more else ""), file=sys.stderr)
            if not args.yes:
                if not sys.stdin.isatty():
                    n = shown["count"]
                    raise InputError(f"cancel: {n} job{'s' if n != 1 else ''} would be "
                                     "cancelled, and this is no terminal to ask on; add "
                                     f"--yes to cancel {'them' if n != 1 else 'it'}")
                if not _ask(shown["count"]):
                    print("nothing was cancelled", file=sys.stderr)
                    return 0
            as_of = shown["as_of"]
        done = c.cancel_jobs(args.jobs, submitted_before=as_of, **filters)
    if args.json:
        print(json.dumps(done, indent=2, default=str))
        return 0
    cancelled = set(done["cancelled"])
    for j in done["jobs"]:
        print(_line(j, "cancelled" if j["id"] in cancelled else f"{j['state']}, not "
                    "cancelled (it ended meanwhile)"))
    if done["count"] > len(done["jobs"]):
        print(f"... and {done['count'] - len(done['jobs'])} more")
    if len(cancelled) != 1:
        print(f"cancelled {len(cancelled)} job{'s' if len(cancelled) != 1 else ''}"
              + ("" if done["count"] else ": no job of that reference is pending or live"))
    return 0


def add_commands(sub, client: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "cancel", parents=[client],
        help="cancel jobs by id, name or array, or by --team/--user/--state/--name (scancel)",
        description="Cancel jobs (scancel): by reference at once; by filters (all must "
        "hold) after showing how many match and asking [y/N] on a terminal (--yes: "
        "without asking). Their resources return at once.")
    p.add_argument("jobs", nargs="*", metavar="JOB", help="job id, unique id prefix (4+ "
                   "characters), job name or array (every element); NAME_3: element 3")
    p.add_argument("--team", help="only this team's jobs (a team token: its own only)")
    p.add_argument("--user", "-u", help="only this user's jobs (scancel -u)")
    p.add_argument("--state", help=f"only jobs in this state: {', '.join(CANCELLABLE)}")
    p.add_argument("--name", help="only jobs of this name (scancel -n)")
    p.add_argument("--yes", "-y", action="store_true",
                   help="cancel what the filters match without asking")
    p.set_defaults(func=cmd_cancel)
