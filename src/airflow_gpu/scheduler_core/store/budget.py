"""The PostgreSQL connection budget of a deployment (docs/service.md, "Connection budget"):
how many connections each API process pools for requests and passes, sized at start-up
from the server's `max_connections`, the replicas and the worker processes, with one
connection more per process for leadership (the scheduler lock, never from the pool)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy import Engine, text

from ..errors import InputError
from .db import POOL_SIZE, POOL_SIZE_ENV, pool_size_from

REPLICAS = 3                      # the documented deployment: three replicas
REPLICAS_ENV = "AIRFLOW_GPU_REPLICAS"
# The replicas together take at most this share of the connections PostgreSQL lets
# roles that are not superusers open: the rest is for Airflow's own components (often
# on the same server), CLI commands, psql and monitoring.
SHARE = 0.5
LEADERSHIP = 1                    # per process: the scheduler lock's connection
# Threads of the scheduling loop that use the pool beside the API's: passes, lease checks.
LOOP_THREADS = 2

_SETTINGS = text("SELECT name, setting FROM pg_settings WHERE name IN ('max_connections', "
                 "'superuser_reserved_connections', 'reserved_connections')")


def replicas_from(value: str | int | None, what: str = "--replicas") -> int:
    """The replicas of the deployment (1 to 1000); REPLICAS when unset."""
    if value is None or value == "":
        return REPLICAS
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"{what}: {value!r} is not a number of replicas; give how many "
                         f"servers share the database (default {REPLICAS})") from None
    if not 1 <= n <= 1000:
        raise InputError(f"{what}: {n} is out of bounds; use 1 to 1000 (how many servers "
                         f"share the database, default {REPLICAS})")
    return n


@dataclass(frozen=True)
class Budget:
    pool: int                 # per process: requests and scheduling passes
    replicas: int
    workers: int
    max_connections: int
    reserved: int             # for superusers (and pg_use_reserved_connections)
    configured: bool          # --db-pool-size (or its variable) set the pool

    @property
    def per_replica(self) -> int:
        return self.workers * (self.pool + LEADERSHIP)

    @property
    def total(self) -> int:
        return self.replicas * self.per_replica

    @property
    def usable(self) -> int:
        return self.max_connections - self.reserved

    def line(self) -> str:
        """The start-up log line."""
        procs = (f" per process (x {self.workers} worker processes)" if self.workers > 1
                 else "")
        how = ("set by --db-pool-size" if self.configured else
               f"sized to {SHARE:.0%} of what PostgreSQL allows")
        return (f"connection budget: {self.pool} for requests, {LEADERSHIP} for leadership"
                f"{procs}, of PostgreSQL's max_connections {self.max_connections} shared "
                f"by {self.replicas} replicas ({how}): at most {self.total} in all of the "
                f"{self.usable} open to roles that are not superusers ({self.reserved} "
                f"reserved), {self.usable - self.total} left for other clients")

    def overrun(self) -> str | None:
        """What is wrong when the replicas may open more than PostgreSQL allows."""
        if self.total <= self.usable:
            return None
        return (f"--db-pool-size: {self.pool} is too large for {self.replicas} replicas x "
                f"{self.workers} worker processes: they may open {self.total} connections "
                f"and PostgreSQL's max_connections {self.max_connections} allows "
                f"{self.usable} (less {self.reserved} reserved); requests and leader "
                "elections will fail with 'too many clients'. Lower --db-pool-size, "
                "--workers or --replicas, or raise max_connections")


def server_limits(engine: Engine) -> tuple[int, int]:
    """PostgreSQL's max_connections and the connections it reserves for superusers."""
    with engine.connect() as conn:
        found = {name: int(value) for name, value in conn.execute(_SETTINGS)}
    return (found["max_connections"], found.get("superuser_reserved_connections", 0)
            + found.get("reserved_connections", 0))


def connection_budget(engine: Engine, replicas: int, workers: int,
                      pool_size: int | None = None) -> Budget:
    """The budget on `engine`'s server: `pool_size` (else $AIRFLOW_GPU_DB_POOL_SIZE) when
    set, else SHARE of the usable connections split among replicas x workers, each
    process keeping one for leadership, at most POOL_SIZE (no more threads use it)."""
    configured = pool_size or pool_size_from(os.environ.get(POOL_SIZE_ENV), POOL_SIZE_ENV)
    max_connections, reserved = server_limits(engine)
    if configured:
        return Budget(configured, replicas, workers, max_connections, reserved, True)
    usable = max_connections - reserved
    per_process = int(usable * SHARE) // (replicas * workers)
    pool = min(POOL_SIZE, per_process - LEADERSHIP)
    if pool < 2:
        raise InputError(
            f"--replicas: {replicas} replicas x {workers} worker processes leave "
            f"{per_process} connection(s) per process of PostgreSQL's max_connections "
            f"{max_connections} ({usable} without the {reserved} reserved; the replicas "
            f"take at most {SHARE:.0%}); each process needs at least 3 (2 for requests, 1 "
            "for leadership). Raise max_connections, lower --workers or --replicas, or "
            "set --db-pool-size")
    return Budget(pool, replicas, workers, max_connections, reserved, False)


def at_start(engine: Engine, replicas: str | int | None, workers: int) -> Budget | None:
    """`airflow-gpu server` before it starts its processes: the budget on PostgreSQL
    (None on SQLite), its pool size set for every worker process ($AIRFLOW_GPU_DB_POOL_SIZE)
    and said in one log line."""
    import logging

    if engine.dialect.name != "postgresql":
        return None
    n = (replicas_from(replicas) if replicas is not None
         else replicas_from(os.environ.get(REPLICAS_ENV), REPLICAS_ENV))
    budget = connection_budget(engine, n, workers)
    os.environ[POOL_SIZE_ENV] = str(budget.pool)
    log = logging.getLogger(__name__)
    log.info("%s", budget.line())
    if budget.overrun():
        log.warning("%s", budget.overrun())
    with engine.connect() as conn:
        if conn.execute(text("SHOW autovacuum")).scalar() == "off":
            log.warning("%s", AUTOVACUUM_OFF)
    return budget


AUTOVACUUM_OFF = (
    "PostgreSQL's autovacuum is off: every running job's heartbeat writes its row, and "
    "without autovacuum the jobs table's dead rows and stale statistics slow every "
    "scheduling pass and request as the hours go by (seconds a pass with thousands of "
    "running jobs). Turn it on (autovacuum = on, PostgreSQL's default) or run VACUUM "
    "ANALYZE jobs every few minutes")


def fit_threads(engine: Engine) -> None:
    """In the API's event loop, on PostgreSQL: at most LOOP_THREADS API threads fewer than
    the pool holds (FastAPI runs routes in anyio's default threads), so requests wait for
    a thread, not for a connection, and the scheduling loop always finds one free."""
    import anyio.to_thread

    if engine.dialect.name != "postgresql":
        return
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(1, min(limiter.total_tokens,
                                      engine.pool.size() - LOOP_THREADS))
