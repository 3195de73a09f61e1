"""`airflow-gpu server`, `token create`, `db upgrade`, and the client commands on the API
(`submit`, `status`, `queue`, `cluster`, `explain`, `cancel`, `drain`, `resume`,
`slowdown`, `teams`, `team-set`)."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from rich.table import Table

from .scheduler_core.errors import InputError
from .scheduler_core.units import format_duration

DEFAULT_DB = "sqlite:///airflow-gpu.db"


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=DEFAULT_DB,
                   help=f"SQLAlchemy URL (default {DEFAULT_DB}; or postgresql+psycopg://...)")


def cmd_server(args: argparse.Namespace) -> int:
    import os

    import uvicorn

    from .scheduler_core.engine.cluster import load_cluster
    from .scheduler_core.policy.config import load_policy

    load_cluster(args.cluster)               # bad input fails here, with its message
    if args.policy_file:
        load_policy(args.policy_file)
    if args.deployment is not None and not re.fullmatch(r"[^\x00-\x1f\x7f]{1,200}",
                                                        args.deployment):
        raise InputError(f"--deployment: {args.deployment!r} is not a name; use 1-200 "
                         "printable characters, the same for every replica of the deployment")
    if args.deployment is not None:
        os.environ["AIRFLOW_GPU_DEPLOYMENT"] = args.deployment
    if args.db_pool_size is not None:     # each worker process reads it (store/db.py)
        from .scheduler_core.store.db import POOL_SIZE_ENV, pool_size_from

        os.environ[POOL_SIZE_ENV] = str(pool_size_from(args.db_pool_size))
    if args.leader_lease is not None:     # each worker process reads it (service/loop.py)
        if not 0.5 <= args.leader_lease <= 3600:
            raise InputError(f"--leader-lease: {args.leader_lease:g} is out of bounds; use "
                             "0.5 to 3600 seconds (default: 3 scheduling rounds, at least 5)")
        os.environ["AIRFLOW_GPU_LEADER_LEASE"] = str(args.leader_lease)
    if args.workers > 1 and args.db.startswith("sqlite"):
        raise InputError(f"--workers: {args.workers} processes cannot share a SQLite "
                         "database; use PostgreSQL (--db postgresql+psycopg://...) or 1")
    # Each worker process builds its own app from these (uvicorn needs an import string
    # to start several); with PostgreSQL one of them schedules, all serve the API.
    os.environ.update({
        "AIRFLOW_GPU_DB": args.db, "AIRFLOW_GPU_CLUSTER": args.cluster,
        "AIRFLOW_GPU_POLICY_FILE": args.policy_file or "",
        "AIRFLOW_GPU_LEASE_TTL": str(args.lease_ttl),
        "AIRFLOW_GPU_HOST_TIMEOUT": str(args.host_timeout),
        "AIRFLOW_GPU_INTERVAL": str(args.interval), "AIRFLOW_GPU_LOG_LEVEL": args.log_level})
    uvicorn.run("airflow_gpu.scheduler_core.service.app:app_from_env", factory=True,
                host=args.host, port=args.port, log_level=args.log_level,
                workers=args.workers)
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from .scheduler_core.service.auth import create_token
    from .scheduler_core.store.db import make_engine, sessions, upgrade

    if args.agent and not args.host:
        raise InputError("--agent: name the host(s) the agent token is for: --host NAME "
                         "(repeat it, or a glob pattern such as --host 'dgx-*')")
    if args.host and not args.agent:
        raise InputError("--host: only agent tokens are for hosts; add --agent")
    if not args.agent and not args.team:
        raise InputError("--team: a team or admin token needs a team (--team T)")
    engine = make_engine(args.db)
    try:
        upgrade(engine)
        print(create_token(sessions(engine), args.team, args.admin,
                           args.host if args.agent else None))
    finally:
        engine.dispose()
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from .scheduler_core.service.auth import CACHE_SECONDS, revoke_team_tokens, revoke_token
    from .scheduler_core.store.db import make_engine, sessions, upgrade

    if bool(args.token) == bool(args.team):
        raise InputError("token revoke: give the token, or --team T for all of a team's "
                         "tokens")
    engine = make_engine(args.db)
    try:
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


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from .scheduler_core.store.db import current_revision, make_engine, upgrade

    engine = make_engine(args.db)
    try:
        upgrade(engine)
        print(f"database at revision {current_revision(engine)} ({engine.url!r})")
    finally:
        engine.dispose()
    return 0


def _client(args: argparse.Namespace):
    """The service and token from flags, else AIRFLOW_GPU_URL / AIRFLOW_GPU_TOKEN, else
    (inside Airflow) the `gpu_scheduler` connection named by --conn-id."""
    import os

    from .scheduler_core.client import Client

    url = args.url or os.environ.get("AIRFLOW_GPU_URL")
    token = args.token or os.environ.get("AIRFLOW_GPU_TOKEN")
    if not (url and token):
        options = _airflow_connection(args.conn_id)
        if options:
            url, token = url or options["url"], token or options["token"]
            return Client(url, token, options["timeout"], options["verify"])
    return Client(url, token)


def _airflow_connection(conn_id: str) -> dict | None:
    """The connection's client options, where Airflow is installed and defines it."""
    try:
        from .hooks.scheduler import GpuSchedulerHook, client_options
    except ImportError:                     # no Airflow here: flags and environment only
        return None
    try:
        return client_options(GpuSchedulerHook.get_connection(conn_id))
    except Exception:   # undefined connection, no metadata DB: fall back to the defaults
        return None


def _out(args: argparse.Namespace, data: Any, table) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        from .cli import _console

        _console().print(table(data))


def cmd_submit(args: argparse.Namespace) -> int:
    from .scheduler_core.errors import load_yaml

    data = load_yaml(args.file)
    specs = data["jobs"] if isinstance(data, dict) and "jobs" in data else [data]
    if not all(isinstance(s, dict) for s in specs):
        raise InputError("expected a job spec mapping or 'jobs: [...]'", args.file)
    if args.key and len(specs) > 1:
        raise InputError("--key: an idempotency key names one job; the file holds "
                         f"{len(specs)}", args.file)
    import uuid

    # One idempotency key per job of the file (--key for a single job): the client
    # retries a submit that got no answer with the same key, so none is created twice.
    keys = [args.key] if args.key else [str(uuid.uuid4()) for _ in specs]
    with _client(args) as c:
        jobs = [c.submit(s, k) for s, k in zip(specs, keys, strict=True)]
    if args.json:
        print(json.dumps(jobs[0] if len(jobs) == 1 else jobs, indent=2, default=str))
    else:
        for j in jobs:
            print(j["id"])
    return 0


def _show(call, table):
    """A client command: call the API, print the answer as a table (or JSON)."""
    def run(args: argparse.Namespace) -> int:
        with _client(args) as c:
            _out(args, call(c, args), table)
        return 0
    return run


def _host_line(h: dict) -> str:
    return f"{h['name']}: {'drained' if h['drained'] else 'in service'}"


# -- tables ------------------------------------------------------------------------------
def _teams_table(teams: list[dict]) -> Table:
    t = Table(title="Teams", title_justify="left")
    errors = any(x.get("error") for x in teams)    # a stored setting the service refuses
    for col in ("team", "share", "quota GPUs", "may borrow", "GPUs held", "borrowed",
                "lent") + (("error",) if errors else ()):
        t.add_column(col)
    for x in teams:
        quota = "-" if x["quota_gpus"] is None else str(x["quota_gpus"])
        borrow = ("-" if x["quota_gpus"] is None else "no limit"
                  if x.get("borrow_gpus") is None else str(x["borrow_gpus"]))
        t.add_row(x["name"], f"{x['share']:g}", quota, borrow, str(x["held_gpus"]),
                  str(x.get("borrowed_gpus", 0)), str(x.get("lent_gpus", 0)),
                  *((x.get("error") or "-",) if errors else ()))
    return t


def _eta(j: dict) -> str:
    p = j.get("pending") or {}
    return format_duration(p["eta_seconds"]) if p.get("eta_seconds") is not None else "-"


def _queue_table(jobs: list[dict]) -> Table:
    t = Table(title="Jobs", title_justify="left")
    for col in ("id", "name", "team", "state", "code", "ETA", "hosts", "notes"):
        t.add_column(col, overflow="fold")
    for j in jobs:
        hosts = ",".join(dict.fromkeys(r["host"] for r in j.get("replicas", [])))
        t.add_row(j["id"], j["name"], j["team"], j["state"],
                  (j.get("pending") or {}).get("code") or "-", _eta(j), hosts or "-",
                  _notes(j))
    return t


def _notes(j: dict) -> str:
    """Borrowed quota and restarts, as squeue's RESTARTS and Kueue's borrowing show."""
    notes = []
    if j.get("borrowed") and j["state"] in ("admitted", "running", "preempting"):
        notes.append("borrowed")
    if j.get("preemptions"):
        notes.append(f"preempted {j['preemptions']}x (last by {j.get('preempted_by')})")
    return "; ".join(notes) or "-"


def _job_table(j: dict) -> Table:
    t = Table(title=f"Job {j['id']} ({j['name']}, team {j['team']}): {j['state']}",
              title_justify="left")
    for col in ("role", "#", "host", "GPUs", "CPUs", "NICs"):
        t.add_column(col)
    from .scheduler_core.engine.topology import format_cpulist

    for r in j.get("replicas", []):
        t.add_row(r["role"], str(r["index"]), r["host"], ",".join(map(str, r["gpus"])) or "-",
                  format_cpulist(r["cpus"]), ",".join(r["nics"]) or "-")
    p = j.get("pending")
    if p and p.get("code"):
        t.caption = f"{p['code']}: {p['reason']} (ETA {_eta(j)})"
    return t


def _explain_table(e: dict) -> Table:
    t = Table(title=f"Job {e['id']}: {e['state']}" + (
        f" - {e['code']}: {e['reason']}" if e.get("code") else ""), title_justify="left")
    t.add_column("at")
    t.add_column("event")
    t.add_column("message", overflow="fold")
    for ev in e["events"]:
        t.add_row(str(ev["at"]), ev["kind"], ev["message"])
    lines = []
    if e.get("eta_seconds") is not None:
        lines.append(f"ETA {format_duration(e['eta_seconds'])}")
    elif e.get("elapsed_s") is not None:
        lines.append(elapsed_line(e))
    if e.get("preemptions"):
        lines.append(f"preempted {e['preemptions']} time(s); last: {e['preempt_reason']}")
    t.caption = "\n".join(lines) or None
    return t


def elapsed_line(e: dict) -> str:
    """"ran 1h02m of its 2h time limit", as squeue's TIME and TIME_LIMIT columns."""
    limit = e.get("time_limit_s")
    verb = "running for" if e["state"] in ("admitted", "running", "preempting") else "ran"
    text = f"{verb} {format_duration(e['elapsed_s'])}"
    if limit is None:
        return text + " (no time limit)"
    text += f" of its {format_duration(limit)} time limit"
    if e.get("limit_cut_by"):
        text += f" (cut by backfill, ahead of the reservation of job {e['limit_cut_by']})"
    return text


def _cluster_table(c: dict) -> Table:
    t = Table(title=f"Cluster {c['cluster']}: {c['gpus_allocated']} of {c['gpus_total']} "
              "GPUs allocated", title_justify="left")
    for col in ("host", "model", "rack", "switch", "state", "free", "GPUs (job per GPU)",
                "util % (per GPU)", "power"):
        t.add_column(col, overflow="fold")
    for h in c["hosts"]:
        cells = " ".join(("x" if not g["healthy"] else (g["job"] or "")[:8] or ".")
                         for g in h["gpus"])
        util = [g.get("utilization_gpu") for g in h["gpus"]]
        watts = [g["power_watts"] for g in h["gpus"] if g.get("power_watts") is not None]
        state = ("unreachable" if not h.get("reachable", True) else
                 "drained" if h["drained"] else "ok")
        t.add_row(h["name"], h["model"], h["rack"], h["switch"], state, str(h["free_gpus"]),
                  cells, " ".join("-" if u is None else f"{u:.0f}" for u in util)
                  if any(u is not None for u in util) else "-",
                  f"{sum(watts):.0f} W" if watts else "-")
    return t


def _slowdown_table(d: dict) -> Table:
    t = Table(title="Locality slowdown the scheduler plans with (runtime factor by "
              "placement)", title_justify="left")
    for col in ("job class", *d["tiers"], "samples"):
        t.add_column(col, justify="left" if col == "job class" else "right")
    t.add_row("(policy)", *(f"{f:g}" for f in d["default"]), "-")
    for c in d["classes"]:
        t.add_row(c["job_class"] or "(none)", *(f"{x['factor']:.3g}" for x in c["tiers"]),
                  " / ".join(str(x["samples"]) for x in c["tiers"]))
    t.caption = ("learned from jobs that ran to their end" if d["learn"] else
                 "learning is off (learn_slowdown: false)")
    return t


# -- the parsers ---------------------------------------------------------------------------
def add_commands(sub) -> None:
    s = sub.add_parser("server", help="run the scheduler-core service (API + scheduling loop)")
    _db_arg(s)
    s.add_argument("--cluster", default="example", help="cluster file or built-in name")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--policy-file", help="queue policy file (weights, teams, quotas)")
    s.add_argument("--lease-ttl", type=float, default=60.0,
                   help="seconds an admitted job lives without a heartbeat (default 60)")
    s.add_argument("--interval", type=float, default=2.0,
                   help="seconds between scheduling passes (default 2)")
    s.add_argument("--host-timeout", type=float, default=60.0,
                   help="seconds a host's node agent may be silent before the host is "
                   "unreachable (default 60; keep it above 3x the agents' --interval)")
    s.add_argument("--workers", type=int, default=1,
                   help="API processes (PostgreSQL only; one of them schedules)")
    s.add_argument("--deployment", help="PostgreSQL: names the scheduler lock the replicas "
                   "of this deployment share (give them all the same name; default "
                   "$AIRFLOW_GPU_DEPLOYMENT, else the schema the tables are in, so "
                   "deployments in different schemas of one database each schedule); "
                   "/healthz shows it and who holds the lock")
    s.add_argument("--db-pool-size", help="PostgreSQL: connections each API process pools, "
                   "at most (default $AIRFLOW_GPU_DB_POOL_SIZE, else 41: the API's 40 "
                   "threads and the scheduling loop); a replica uses this plus one per "
                   "process for the scheduler lock, times --workers (docs/service.md, "
                   "Connection budget)")
    s.add_argument("--leader-lease", type=float, metavar="SECONDS",
                   help="PostgreSQL: how long the scheduling leader's lease lasts unrenewed: "
                   "a frozen leader is replaced after it, and a pass may take at most that "
                   "long (default $AIRFLOW_GPU_LEADER_LEASE, else 3 scheduling rounds, at "
                   "least 5 s; docs/service.md, Leadership)")
    s.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="what the server logs on stderr (default info: who schedules, who "
                   "holds the deployment's lock, passes that fail or have stopped)")
    s.set_defaults(func=cmd_server)

    tok = sub.add_parser("token", help="API tokens")
    tsub = tok.add_subparsers(dest="token_command", required=True)
    tc = tsub.add_parser("create", help="create a token for a team, an admin or a node "
                         "agent; prints it once")
    tc.add_argument("--team", help="the team the token acts for (agent tokens: default "
                    "'agents', a label only)")
    tc.add_argument("--admin", action="store_true", help="may drain hosts and act for any team")
    tc.add_argument("--agent", action="store_true",
                    help="a node agent's token: it may only register and report the --host "
                    "hosts (no jobs, teams or admin routes)")
    tc.add_argument("--host", action="append", metavar="NAME",
                    help="with --agent: a host the token is for, or a glob pattern "
                    "('dgx-*'); repeat for several")
    _db_arg(tc)
    tc.set_defaults(func=cmd_token_create)
    tr = tsub.add_parser("revoke", help="delete a token (or all of a team's); the service "
                         "refuses it within a second")
    tr.add_argument("token", nargs="?", help="the token to revoke")
    tr.add_argument("--team", help="revoke every token of this team instead")
    _db_arg(tr)
    tr.set_defaults(func=cmd_token_revoke)

    d = sub.add_parser("db", help="the service's database")
    dsub = d.add_subparsers(dest="db_command", required=True)
    du = dsub.add_parser("upgrade", help="create or migrate the schema (idempotent)")
    _db_arg(du)
    du.set_defaults(func=cmd_db_upgrade)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", help="the service (default $AIRFLOW_GPU_URL or "
                        "http://127.0.0.1:8080)")
    client.add_argument("--token", help="bearer token (default $AIRFLOW_GPU_TOKEN)")
    client.add_argument("--conn-id", default="gpu_scheduler_default",
                        help="inside Airflow, without --url/--token or the variables: the "
                        "gpu_scheduler connection to read them from")
    client.add_argument("--json", action="store_true", help="print JSON")
    from .acct_cli import add_acct

    add_acct(sub, client)
    for name, func, helptext, extra in (
            ("submit", cmd_submit, "submit a job file; prints the job id", ("file",)),
            ("status", _show(lambda c, a: c.job(a.id), _job_table),
             "one job: state and placement", ("id",)),
            ("queue", _show(lambda c, a: c.jobs(a.state, a.team), _queue_table),
             "jobs with their state, reason and ETA", ()),
            ("cluster", _show(lambda c, a: c.cluster(), _cluster_table),
             "hosts, GPUs and who holds them", ()),
            ("explain", _show(lambda c, a: c.explain(a.id), _explain_table),
             "why a job waits, its ETA and its events", ("id",)),
            ("cancel", _show(lambda c, a: c.cancel(a.id), _job_table),
             "cancel a job (releases its resources)", ("id",)),
            ("drain", _show(lambda c, a: c.drain(a.host, True), _host_line),
             "keep new work off a host (admin)", ("host",)),
            ("resume", _show(lambda c, a: c.drain(a.host, False), _host_line),
             "put a drained host back in service (admin)", ("host",)),
            ("slowdown", _show(lambda c, a: c.slowdown(), _slowdown_table),
             "the locality slowdown per job class, as learned from ended jobs", ()),
            ("teams", _show(lambda c, a: c.teams(), _teams_table),
             "teams: share, GPU quota, GPUs held", ()),
            ("team-set", _show(lambda c, a: [c.set_team(a.name, a.share, a.quota_gpus,
                                                        a.borrow_gpus)], _teams_table),
             "set a team's share, GPU quota and borrowing limit (admin)", ("name",))):
        p = sub.add_parser(name, help=helptext, parents=[client])
        for arg in extra:
            p.add_argument(arg)
        if name == "submit":
            p.add_argument("--key", help="idempotency key: submitting again returns the same job")
        if name == "team-set":
            p.add_argument("--share", type=float, help="fair-share weight, 0.001 to "
                           "1000000 (omit: the policy file's)")
            p.add_argument("--quota-gpus", type=int,
                           help="GPUs guaranteed to the team, 0 to 1000000 (omit: no "
                           "quota)")
            p.add_argument("--borrow-gpus", type=int,
                           help="GPUs it may hold beyond its quota while other teams leave "
                           "them idle, 0 (a hard quota) to 1000000 (omit: the policy file's)")
        if name == "queue":
            p.add_argument("--state", help="only jobs in this state")
            p.add_argument("--team", help="only this team's jobs")
        p.set_defaults(func=func)
