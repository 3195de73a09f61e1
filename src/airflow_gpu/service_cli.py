"""`airflow-gpu server`, `token create` and `revoke` on the database (`--db`; the `token`
commands are token_cli.py's), `db upgrade` (`db check`, `db repair`: db_cli.py), and the
client commands on the API
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


def _db_arg(p: argparse.ArgumentParser, create: bool = False) -> None:
    p.add_argument("--db", default=DEFAULT_DB,
                   help=f"SQLAlchemy URL (default {DEFAULT_DB}; or postgresql+psycopg://...)")
    if create:
        p.add_argument("--create", action="store_true",
                       help="SQLite: create the database file when it does not exist (else "
                       "refused, so a mistyped path does not start an empty database; "
                       "`airflow-gpu db upgrade --db URL` creates it too)")


def _check_team(team: str | None, what: str = "--team") -> None:
    """A team name as job specs and the API take it (jobspec's team field)."""
    from .scheduler_core.jobspec import _NAME, MAX_TEXT

    if team is not None and not (re.fullmatch(_NAME.strip("^$"), team)
                                 and len(team) <= MAX_TEXT):
        shown = repr(team) if len(team) <= 60 else repr(f"{team[:57]}...")
        raise InputError(f"{what}: {shown} is not a team name; use letters, digits, '_', "
                         f"'.' and '-', starting with a letter or digit, at most {MAX_TEXT} "
                         "characters (as job specs name teams)")


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
    from .scheduler_core.service.probes import ENV, protect_mode
    from .scheduler_core.store.db import open_database

    # each worker process reads it (service/app.py); a bad value fails here, in one line
    os.environ[ENV] = (protect_mode(args.protect_metrics) if args.protect_metrics is not None
                       else protect_mode(os.environ.get(ENV), ENV))
    if args.db_pool_timeout is not None:
        from .scheduler_core.store.db import POOL_TIMEOUT_ENV, pool_timeout_from

        os.environ[POOL_TIMEOUT_ENV] = str(pool_timeout_from(args.db_pool_timeout))
    from .scheduler_core.service.app import _log_to_stderr
    from .scheduler_core.store.budget import at_start
    from .scheduler_core.store.db import database_errors

    _log_to_stderr(args.log_level)          # the budget's line, as the workers log
    engine = open_database(args.db, create=args.create)   # reachable, or one line here
    try:
        with database_errors(args.db):      # PostgreSQL: the pool from max_connections
            at_start(engine, args.replicas, args.workers)
    finally:
        engine.dispose()
    # Each worker process builds its own app from these (uvicorn needs an import string
    # to start several); with PostgreSQL one of them schedules, all serve the API.
    os.environ.update({
        "AIRFLOW_GPU_DB": args.db, "AIRFLOW_GPU_CLUSTER": args.cluster,
        "AIRFLOW_GPU_POLICY_FILE": args.policy_file or "",
        "AIRFLOW_GPU_LEASE_TTL": str(args.lease_ttl),
        "AIRFLOW_GPU_HOST_TIMEOUT": str(args.host_timeout),
        "AIRFLOW_GPU_INTERVAL": str(args.interval), "AIRFLOW_GPU_LOG_LEVEL": args.log_level})
    import faulthandler

    # A fatal signal (SIGBUS: SQLite's -shm made immutable while it runs) names itself
    # and where it struck on stderr, instead of ending the process without a line.
    faulthandler.enable()
    uvicorn.run("airflow_gpu.scheduler_core.service.app:app_from_env", factory=True,
                host=args.host, port=args.port, log_level=args.log_level,
                workers=args.workers)
    return 0


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
    _check_team(args.team)


def cmd_token_create(args: argparse.Namespace) -> int:
    from .scheduler_core.service.auth import create_token
    from .scheduler_core.store.db import database_errors, open_database, sessions, upgrade

    check_token_args(args)
    engine = open_database(args.db, create=args.create)
    try:
        with database_errors(args.db):
            upgrade(engine)
            token = create_token(sessions(engine), args.team, args.admin,
                                 args.host if args.agent else None,
                                 expires_at=getattr(args, "expires_at", None),  # --expires
                                 new_hosts=getattr(args, "allow_new_hosts", None))
    finally:
        engine.dispose()
    print(token)
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from .scheduler_core.service.auth import CACHE_SECONDS, revoke_team_tokens, revoke_token
    from .scheduler_core.store.db import database_errors, open_database, sessions, upgrade

    if bool(args.token) == bool(args.team):
        raise InputError("token revoke: give the token, or --team T for all of a team's "
                         "tokens")
    _check_team(args.team)
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


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from .scheduler_core.store.db import (
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


def service_args(p: argparse.ArgumentParser) -> None:
    """--url, --token, --conn-id: where the client commands find the service (_client)."""
    p.add_argument("--url", help="the service (default $AIRFLOW_GPU_URL or "
                   "http://127.0.0.1:8080)")
    p.add_argument("--token", help="bearer token (default $AIRFLOW_GPU_TOKEN)")
    p.add_argument("--conn-id", default="gpu_scheduler_default",
                   help="inside Airflow, without --url/--token or the variables: the "
                   "gpu_scheduler connection to read them from")


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
    """Check the whole file as `plan` does (exit 2, nothing sent), then submit all of its
    jobs or none in one request (several jobs: POST /api/v1/jobs/batch)."""
    from .scheduler_core.client import ApiError
    from .scheduler_core.errors import load_yaml
    from .scheduler_core.jobclasses import resolve
    from .scheduler_core.jobspec import load_jobs
    from .scheduler_core.plugins import default_registry

    jobs = load_jobs(args.file)          # the same checks and messages as `plan`
    reg = default_registry()
    for job in jobs:
        resolve(job, reg.job_classes, args.file)
    data = load_yaml(args.file)          # sent as written: unset fields stay unset
    specs = data["jobs"] if isinstance(data, dict) and "jobs" in data else [data]
    if args.key and len(specs) > 1:
        raise InputError("--key: an idempotency key names one job; the file holds "
                         f"{len(specs)}", args.file)
    import uuid

    # One idempotency key per job of the file (--key for a single job): the client
    # retries a submit that got no answer with the same keys, so none is created twice.
    keys = [args.key] if args.key else [str(uuid.uuid4()) for _ in specs]
    with _client(args) as c:
        if len(specs) == 1:
            jobs_out = [c.submit(specs[0], keys[0])]
        else:
            try:
                jobs_out = c.submit_batch(specs, keys)
            except ApiError as exc:
                if 400 <= exc.status < 500:     # the batch is refused whole
                    raise ApiError(exc.status, f"{_text(exc.detail)}; none of the "
                                   f"{len(specs)} jobs of {args.file} was submitted") from None
                raise
    if args.json:
        print(json.dumps(jobs_out[0] if len(jobs_out) == 1 else jobs_out, indent=2,
                         default=str))
    else:
        for j in jobs_out:
            print(j["id"])
    return 0


def _text(detail: Any) -> str:
    from .scheduler_core.client import _detail_text

    return _detail_text(detail)


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


def _job_table(j: dict):
    from .status_view import job_table  # its placement now and its earlier admissions

    return job_table(j)


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
    _db_arg(s, create=True)
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
                   "at most (default $AIRFLOW_GPU_DB_POOL_SIZE, else sized at start-up: "
                   "half of the server's max_connections less its reserved ones, split "
                   "among --replicas x --workers, one per process kept for the scheduler "
                   "lock, at most 41); a replica uses this plus one per process for the "
                   "scheduler lock, times --workers (docs/service.md, Connection budget)")
    s.add_argument("--replicas", help="PostgreSQL: how many servers (replicas) share the "
                   "database, for the connection budget (default $AIRFLOW_GPU_REPLICAS, "
                   "else 3)")
    s.add_argument("--db-pool-timeout", metavar="SECONDS",
                   help="PostgreSQL: how long a request waits for a pooled connection "
                   "before it answers 503 with Retry-After (default "
                   "$AIRFLOW_GPU_DB_POOL_TIMEOUT, else 30)")
    s.add_argument("--leader-lease", type=float, metavar="SECONDS",
                   help="PostgreSQL: how long the scheduling leader's lease lasts unrenewed: "
                   "a frozen leader is replaced after it, and a pass may take at most that "
                   "long (default $AIRFLOW_GPU_LEADER_LEASE, else 3 scheduling rounds, at "
                   "least 5 s; docs/service.md, Leadership)")
    s.add_argument("--protect-metrics", metavar="none|token|admin",
                   help="who may read /metrics and /healthz, which name teams, jobs and "
                   "database backends: none (anyone), token (any valid bearer token) or "
                   "admin (an admin token); /livez and /readyz stay open (default "
                   "$AIRFLOW_GPU_PROTECT_METRICS, else none)")
    s.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="what the server logs on stderr (default info: who schedules, who "
                   "holds the deployment's lock, passes that fail or have stopped)")
    s.set_defaults(func=cmd_server)

    d = sub.add_parser("db", help="the service's database")
    dsub = d.add_subparsers(dest="db_command", required=True)
    du = dsub.add_parser("upgrade", help="create or migrate the schema (idempotent)")
    _db_arg(du)
    du.set_defaults(func=cmd_db_upgrade)
    from .db_cli import add_db_commands

    add_db_commands(dsub, _db_arg)       # db check, db repair

    client = argparse.ArgumentParser(add_help=False)
    service_args(client)
    client.add_argument("--json", action="store_true", help="print JSON")
    from .acct_cli import add_acct
    from .token_cli import add_token_commands

    add_acct(sub, client)
    # token list | create | revoke: through the API, or on the database with --db
    add_token_commands(sub, client, cmd_token_create, cmd_token_revoke)
    for name, func, helptext, extra in (
            ("submit", cmd_submit, "submit a job file; prints the job id", ("file",)),
            ("status", _show(lambda c, a: c.job(a.id), _job_table),
             "one job: state and placement", ("id",)),
            ("explain", _show(lambda c, a: c.explain(a.id), _explain_table),
             "why a job waits, its ETA and its events", ("id",)),
            ("cancel", _show(lambda c, a: c.cancel(a.id), _job_table),
             "cancel a job (releases its resources)", ("id",)),
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
        p.set_defaults(func=func)
    from .slurm_cli import add_slurm_commands

    # queue, prio, share, hold, release, requeue, update, drain, cluster
    add_slurm_commands(sub, client, _show)
