"""`airflow-gpu reserve create | list | show | update | delete`: admins' reservations of
whole hosts for a window of time, as Slurm's `scontrol create reservation` and `sinfo -T`
or Grid Engine's qrsub, qrstat and qrdel (docs/admin-guide.md, "Reservations")."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from ...scheduler_core.errors import InputError
from ...scheduler_core.jobspec import compress_hostlist
from ...scheduler_core.units import format_duration, parse_duration
from ..common import api_client, console, output
from .slurm_command import _at
from .status_view import label

WHEN = "an ISO 8601 time (UTC unless it names a zone), now, or now+DURATION (now+1h)"


def reservations_table(rows: list[dict]) -> Table:
    t = Table(title="Reservations (sinfo -T)", title_justify="left")
    for col in ("name", "state", "start (UTC)", "end (UTC)", "duration", "hosts", "teams",
                "flags"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["state"], _at(r["start"]), _at(r["end"]),
                  format_duration(r["duration_s"]), compress_hostlist(r["hosts"]),
                  ",".join(r["teams"]) or "-", "MAINT" if r["maint"] else "-")
    return t


def made_line(r: dict) -> str:
    kind = "maintenance reservation" if r["maint"] else "reservation"
    whom = "" if r["maint"] else f" for {', '.join(r['teams'])}"
    line = (f"{kind} {r['name']}{whom}: {compress_hostlist(r['hosts'])} from "
            f"{_at(r['start'])} to {_at(r['end'])} UTC ({format_duration(r['duration_s'])}"
            f", {r['state']})")
    stops = r.get("stops") or []
    if stops:
        line += (f"\n{len(stops)} running job{'s' if len(stops) > 1 else ''} on its hosts "
                 f"{'are' if len(stops) > 1 else 'is'} expected to run past its start; "
                 "if still running then, each is stopped and requeued under the same id "
                 "(they are told in their events and task logs):")
        for j in stops:
            line += (f"\n  {j['id'][:8]}  {label(j)}  team {j['team']}  {j['state']}  "
                     f"expected to end {_at(j['expected_end'])}"
                     + (f", time limit {_at(j['deadline'])}" if j.get("deadline") else ""))
    return line


def _duration(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise InputError(f"--duration: {value!r} is no duration; write e.g. 90m, 4h or "
                         "1d") from None
    if seconds <= 0:
        raise InputError(f"--duration: {value!r} must be more than 0 (e.g. 4h)")
    return seconds


def cmd_create(args: argparse.Namespace) -> int:
    if args.end and args.duration:
        raise InputError("--end, --duration: give one of them, not both")
    if not (args.end or args.duration):
        raise InputError("--duration: say how long it lasts (--duration 4h) or when it "
                         "ends (--end WHEN)")
    if bool(args.hosts) == (args.gpus is not None):
        raise InputError("--hosts: give the hosts (--hosts dgx-[01-04]) or a GPU count "
                         "(--gpus 16), one of them")
    if args.gpu_model is not None and args.gpus is None:
        raise InputError(f"--gpu-model: {args.gpu_model!r} chooses among the hosts of "
                         "--gpus N; give it with --gpus, or leave it out with --hosts")
    body = {"name": args.name, "start": args.start, "end": args.end,
            "duration": _duration(args.duration), "hosts": args.hosts, "gpus": args.gpus,
            "gpu_model": args.gpu_model, "teams": args.team or [], "maint": args.maint}
    with api_client(args) as c:
        made = c.reserve({k: v for k, v in body.items() if v is not None})
    print(json.dumps(made, indent=2) if args.json else made_line(made))
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    body = {"start": args.start, "end": args.end, "duration": _duration(args.duration),
            "hosts": args.hosts, "teams": args.team}
    body = {k: v for k, v in body.items() if v is not None}
    if not body:
        raise InputError("reserve update: say what changes: --start, --end, --duration, "
                         "--hosts or --team")
    with api_client(args) as c:
        made = c.update_reservation(args.name, body)
    print(json.dumps(made, indent=2) if args.json else made_line(made))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with api_client(args) as c:
        output(args, c.reservations(args.all), reservations_table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with api_client(args) as c:
        got = c.reservation(args.name)
    print(json.dumps(got, indent=2) if args.json else made_line(got))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with api_client(args) as c:
        gone = c.delete_reservation(args.name)
    if args.json:
        print(json.dumps(gone, indent=2))
    else:
        console().print(f"deleted {made_line(gone)}; pending jobs that asked for it are "
                        "cancelled, its hosts are back")
    return 0


def add_commands(sub, client: argparse.ArgumentParser) -> None:
    p = sub.add_parser("reserve", help="admins' reservations of hosts for a window of "
                       "time: maintenance or a team's (scontrol create reservation, qrsub)",
                       description="Reservations of whole hosts for a window of time.")
    group = p.add_subparsers(dest="reserve_command", required=True)

    def add(name: str, func, helptext: str) -> argparse.ArgumentParser:
        q = group.add_parser(name, help=helptext, description=helptext, parents=[client])
        q.set_defaults(func=func)
        return q

    def when(q: argparse.ArgumentParser, start_default: str | None) -> None:
        q.add_argument("--start", default=start_default, help=f"when it starts: {WHEN}"
                       + (" (default: now)" if start_default else ""))
        q.add_argument("--end", help=f"when it ends: {WHEN}")
        q.add_argument("--duration", help="how long it lasts, e.g. 4h (instead of --end)")

    q = add("create", cmd_create, "make a reservation (admin)")
    q.add_argument("name")
    q.add_argument("--hosts", help="host names or ranges, e.g. dgx-[01-04],dgx-h-05")
    q.add_argument("--gpus", type=int, help="instead of --hosts: this many GPUs, as the "
                   "fewest whole hosts that hold them")
    q.add_argument("--gpu-model", help="with --gpus: hosts whose GPU name contains this "
                   "(A100, H100)")
    when(q, "now")
    q.add_argument("--team", action="append", help="a team whose jobs may run in it "
                   "(repeat for several); they ask for it with `reservation: NAME`")
    q.add_argument("--maint", action="store_true", help="maintenance: for no team; its "
                   "hosts drain at its start and resume at its end")
    q = add("list", cmd_list, "reservations that have not ended, by start (sinfo -T)")
    q.add_argument("--all", action="store_true", help="the ended ones too")
    q = add("show", cmd_show, "one reservation (scontrol show reservation)")
    q.add_argument("name")
    q = add("update", cmd_update, "change a reservation's time, hosts or teams (admin)")
    q.add_argument("name")
    q.add_argument("--hosts")
    when(q, None)
    q.add_argument("--team", action="append", help="the teams, replacing the old ones")
    q = add("delete", cmd_delete, "delete a reservation (admin): its hosts come back, "
            "pending jobs that asked for it are cancelled")
    q.add_argument("name")
