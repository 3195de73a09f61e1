"""`airflow-gpu server`: the scheduler-core service (the API and the scheduling loop)
under uvicorn, its settings checked here first, each in one line."""

from __future__ import annotations

import argparse
import re

from ...scheduler_core.errors import InputError
from ..common import db_arg


def cmd_server(args: argparse.Namespace) -> int:
    import os

    import uvicorn

    from ...scheduler_core.engine.cluster import load_cluster
    from ...scheduler_core.policy.config import load_policy

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
        from ...scheduler_core.store.db import POOL_SIZE_ENV, pool_size_from

        os.environ[POOL_SIZE_ENV] = str(pool_size_from(args.db_pool_size))
    if args.leader_lease is not None:     # each worker process reads it (service/loop.py)
        if not 0.5 <= args.leader_lease <= 3600:
            raise InputError(f"--leader-lease: {args.leader_lease:g} is out of bounds; use "
                             "0.5 to 3600 seconds (default: 3 scheduling rounds, at least 5)")
        os.environ["AIRFLOW_GPU_LEADER_LEASE"] = str(args.leader_lease)
    if args.workers > 1 and args.db.startswith("sqlite"):
        raise InputError(f"--workers: {args.workers} processes cannot share a SQLite "
                         "database; use PostgreSQL (--db postgresql+psycopg://...) or 1")
    from ...scheduler_core.service.probes import ENV, protect_mode
    from ...scheduler_core.store.db import open_database

    # each worker process reads it (api/app.py); a bad value fails here, in one line
    os.environ[ENV] = (protect_mode(args.protect_metrics) if args.protect_metrics is not None
                       else protect_mode(os.environ.get(ENV), ENV))
    if args.db_pool_timeout is not None:
        from ...scheduler_core.store.db import POOL_TIMEOUT_ENV, pool_timeout_from

        os.environ[POOL_TIMEOUT_ENV] = str(pool_timeout_from(args.db_pool_timeout))
    from ...scheduler_core.api.app import log_to_stderr
    from ...scheduler_core.store.budget import at_start
    from ...scheduler_core.store.db import database_errors

    log_to_stderr(args.log_level)          # the budget's line, as the workers log
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
    uvicorn.run("airflow_gpu.scheduler_core.api.app:app_from_env", factory=True,
                host=args.host, port=args.port, log_level=args.log_level,
                workers=args.workers)
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("server", help="run the scheduler-core service (API + scheduling loop)")
    db_arg(s, create=True)
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
