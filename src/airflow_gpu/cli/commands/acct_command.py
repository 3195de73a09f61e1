"""`airflow-gpu acct`: GPU accounting as Slurm's sacct or Grid Engine's qacct show it:
per job (with its replicas under it, as sacct shows job steps), per team or per day and
team; a table, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import UTC, datetime, timedelta

from rich.table import Table

from ...scheduler_core.errors import InputError
from ...scheduler_core.jobspec import compress_hostlist
from ...scheduler_core.units import format_duration, format_size, parse_duration
from ..common import api_client, console

COLUMNS = {
    "job": ("job", "name", "team", "state", "exit_code", "started_at", "finished_at",
            "elapsed_seconds", "gpus", "mig_devices", "gpu_hours", "mig_device_hours",
            "utilization_mean", "utilization_peak", "memory_peak_bytes", "energy_joules",
            "zero_utilization_seconds", "idle_flagged"),
    "team": ("team", "jobs", "gpu_hours", "mig_device_hours", "utilization_mean",
             "utilization_peak", "memory_peak_bytes", "energy_joules",
             "zero_utilization_seconds"),
    "user": ("team", "user", "jobs", "gpu_hours", "mig_device_hours", "utilization_mean",
             "utilization_peak", "memory_peak_bytes", "energy_joules",
             "zero_utilization_seconds"),
    "day": ("day", "team", "jobs", "gpu_hours", "mig_device_hours", "utilization_mean",
            "utilization_peak", "memory_peak_bytes", "energy_joules",
            "zero_utilization_seconds"),
    "reservation": ("reservation", "state", "maint", "teams", "start", "end", "gpus", "jobs",
                    "reserved_gpu_hours", "used_gpu_hours", "unused_gpu_hours",
                    "used_fraction"),
}


def when(value: str | None, flag: str) -> str | None:
    """An ISO date or time (UTC unless it says), `now`, or a duration ago (`2d`, `12h`)."""
    if value is None:
        return None
    now = datetime.now(UTC)
    if value == "now":
        return now.isoformat()
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        try:
            return (now - timedelta(seconds=parse_duration(value))).isoformat()
        except ValueError:
            raise InputError(f"{flag}: {value!r} is neither a date (2026-11-30, "
                             "2026-11-30T08:00) nor a time ago (12h, 7d)") from None
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    if flag == "--since" and at > now:       # an empty report would hide the typo
        raise InputError(f"--since: {value!r} is in the future (now {now:%Y-%m-%dT%H:%M}Z); "
                         "give a past date or a time ago such as 7d")
    return at.isoformat()


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _energy(j) -> str:
    return "-" if not j else (f"{j / 3.6e6:.2f} kWh" if j >= 3.6e5 else f"{j:.0f} J")


def _common(r: dict, mig: bool = False) -> list[str]:
    hours = [f"{r['gpu_hours']:.2f}"] + ([f"{r.get('mig_device_hours', 0):.2f}"] if mig else [])
    return [*hours, _pct(r["utilization_mean"]), _pct(r["utilization_peak"]),
            format_size(r["memory_peak_bytes"]) if r["memory_peak_bytes"] else "-",
            _energy(r["energy_joules"]), format_duration(r["zero_utilization_seconds"])]


def _gpus(r: dict) -> str:
    """GPUs charged, with the MIG devices among them: `0.86 (2 MIG)`."""
    mig = r.get("mig_devices") or 0
    return f"{r['gpus']:g}" + (f" ({mig} MIG)" if mig else "")


def _cells(r: dict, by: str, mig: bool = False) -> list[str]:
    common = _common(r, mig)
    if by == "team":
        return [r["team"], str(r["jobs"]), *common]
    if by == "user":
        return [r["team"], r["user"] or "-", str(r["jobs"]), *common]
    if by == "day":
        return [r["day"], r["team"], str(r["jobs"]), *common]
    elapsed = r.get("elapsed_seconds")
    state = r["state"] + (f":{r['exit_code']}" if r.get("exit_code") is not None else "")
    # the short id, as queue shows it (--csv and --json keep the whole id)
    return [r["job"][:8], r["name"], r["team"], state + (" idle!" if r["idle_flagged"] else ""),
            _gpus(r), "-" if elapsed is None else format_duration(elapsed), *common]


def reservations_table(data: dict) -> Table:
    t = Table(title=f"GPU-hours per reservation, {data['since']} to {data['until']} (UTC)",
              title_justify="left")
    for col in ("reservation", "state", "teams", "hosts", "GPUs", "jobs", "held GPU-h",
                "used GPU-h", "unused GPU-h", "used"):
        t.add_column(col, overflow="fold")
    for r in data["rows"]:
        t.add_row(r["reservation"], r["state"],
                  "MAINT" if r["maint"] else ",".join(r["teams"]),
                  compress_hostlist(r["hosts"]), str(r["gpus"]), str(r["jobs"]),
                  f"{r['reserved_gpu_hours']:.2f}", f"{r['used_gpu_hours']:.2f}",
                  f"{r['unused_gpu_hours']:.2f}", _pct(None if r["used_fraction"] is None
                                                       else 100 * r["used_fraction"]))
    return t


def table(data: dict) -> Table:
    by = data["by"]
    if by == "reservation":
        return reservations_table(data)
    t = Table(title=f"GPU accounting per {by}, {data['since']} to {data['until']} (UTC)",
              title_justify="left")
    head = {"team": ["team", "jobs"], "user": ["team", "user", "jobs"],
            "day": ["day", "team", "jobs"],
            "job": ["job", "name", "team", "state", "GPUs", "elapsed"]}[by]
    # MIG devices: their hours as a column; GPU-h charges each its share (slices / 7)
    mig = any(r.get("mig_device_hours") for r in data["rows"])
    for col in (*head, "GPU-h", *(("MIG-h",) if mig else ()), "SM% mean", "SM% peak",
                "mem peak", "energy", "at 0%"):
        t.add_column(col, overflow="fold")
    for r in data["rows"]:
        t.add_row(*_cells(r, by, mig))
        for rep in r.get("replicas", ()):      # sacct's steps: one line per replica
            t.add_row(f"  {rep['role']}.{rep['index']}", rep["host"],
                      "", "", ",".join(map(str, rep["gpus"])) or "; ".join(
                          rep.get("mig", ())), "",
                      *_common(rep, mig))
    if mig:
        t.caption = ("GPU-h: whole GPUs, and each MIG device as its share of its GPU "
                     "(compute slices / 7); MIG-h: MIG device-hours")
    return t


def write_csv(data: dict) -> None:
    cols = COLUMNS[data["by"]]
    w = csv.writer(sys.stdout)
    w.writerow(cols)
    for r in data["rows"]:
        w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])


def cmd_acct(args: argparse.Namespace) -> int:
    since, until = when(args.since, "--since"), when(args.until, "--until")  # before asking
    with api_client(args) as c:
        data = c.accounting(args.by, since, until, args.team, args.job)
        if args.job and args.by == "job":
            for r in data["rows"]:
                r["replicas"] = c.usage(r["job"])["replicas"]
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    elif args.csv:
        write_csv(data)
    else:
        console().print(table(data))
    return 0


def add_commands(sub, client: argparse.ArgumentParser) -> None:
    p = sub.add_parser("acct", parents=[client], help="GPU accounting (sacct, qacct): "
                       "GPU-hours, SM utilization, memory, energy, idle time per job, team "
                       "or day")
    p.add_argument("--by", choices=("job", "team", "user", "day", "reservation"),
                   default="job", help="one line per job (default), per team, per user of "
                   "each team, per day and team, or per admin's reservation (GPU-hours "
                   "held, used and unused)")
    p.add_argument("--since", "-S", help="start of the window: a date or time (UTC), or a "
                   "time ago such as 12h or 30d (default: 7 days before --until)")
    p.add_argument("--until", "-E", help="end of the window (default: now)")
    p.add_argument("--team", help="only this team's jobs")
    p.add_argument("--job", "-j", help="only this job (id, unique id prefix or name), with "
                   "its replicas")
    p.add_argument("--csv", action="store_true", help="print CSV (one header line)")
    p.set_defaults(func=cmd_acct)
