"""Engines, sessions and migrations (`airflow-gpu db upgrade`)."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InputError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


# The connection budget of one process (docs/service.md, "Connection budget"). The API runs
# its routes in anyio's default thread pool (40 threads, FastAPI's run_in_threadpool), and
# the scheduling loop runs its passes on one thread more: a pool of 41 never makes a thread
# wait for a connection. The leader's lock connection is opened outside the pool.
API_THREADS = 40
POOL_SIZE = API_THREADS + 1
POOL_SIZE_ENV = "AIRFLOW_GPU_DB_POOL_SIZE"

# SQLite errors after which a connection is thrown away rather than pooled again: one
# opened while the file or its folder was read-only stays read-only for good, and one that
# met a full disk or an I/O error may hold a stale view of the file. Treated as a
# disconnect, the error also discards every other connection of the pool opened before it.
_SQLITE_BROKEN = ("attempt to write a readonly database", "disk i/o error",
                  "database or disk is full", "unable to open database file",
                  "readonly database")


def pool_size_from(value: str | int | None, what: str = "--db-pool-size") -> int | None:
    """A pool size (2 to 1000) from an option or the environment; None when unset."""
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"{what}: {value!r} is not a number of connections") from None
    if not 2 <= n <= 1000:
        raise InputError(f"{what}: {n} is out of bounds (2 to 1000 connections: one for the "
                         "scheduling pass, at least one for the API)")
    return n


def make_engine(url: str, writes: bool = True, pool_size: int | None = None) -> Engine:
    """An engine for `url` (sqlite:///FILE or postgresql+psycopg://...).

    On SQLite, `writes` engines begin every transaction with the write lock; `writes=False`
    gives an engine for reads only, which WAL lets run beside a writer. On PostgreSQL the
    pool holds at most `pool_size` connections (else $AIRFLOW_GPU_DB_POOL_SIZE, else
    POOL_SIZE), never more."""
    if not url.startswith(("sqlite", "postgresql")):
        raise InputError(f"--db: {url!r} is not a SQLite or PostgreSQL URL; use "
                         "sqlite:///path/to/file.db or postgresql+psycopg://user@host/db")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(conn, _):
            conn.isolation_level = None   # transactions are begun below, not by the driver
            cur = conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")   # off by default in SQLite
            cur.execute("PRAGMA journal_mode=WAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
                return                    # each statement commits itself
            # Writers take the write lock up front: a transaction that reads and then writes
            # would otherwise fail at once with "database is locked" when another one writes.
            conn.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")

        @event.listens_for(engine, "handle_error")
        def _sqlite_broken(ctx):
            # A read-only file or folder, a full disk or an I/O error: never pool this
            # connection again (nor the ones opened before it), so requests succeed again
            # as soon as the file is writable, without a restart.
            if any(m in str(ctx.original_exception).lower() for m in _SQLITE_BROKEN):
                ctx.is_disconnect = True

        return engine
    # A pool as large as the threads that use it (the API's and the loop's): no connection
    # is opened per request, and no overflow, so the budget per process is fixed. No
    # pre-ping (a round trip per checkout): after a database restart the first statement
    # on each old connection fails and the pool replaces them all.
    size = pool_size or pool_size_from(os.environ.get(POOL_SIZE_ENV), POOL_SIZE_ENV) \
        or POOL_SIZE
    return create_engine(url, pool_size=size, max_overflow=0, pool_timeout=30,
                         pool_recycle=3600)


def sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _alembic_config(engine: Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


# The PostgreSQL advisory lock that migrations run under (one key for the database).
MIGRATION_LOCK = 0x6169726770756D67   # "airgpumg"


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (idempotent). On PostgreSQL under an advisory lock,
    on the connection Alembic migrates with: replicas (or `--workers`) starting together
    on a fresh database wait for the first one's migrations, then find nothing to do."""
    from alembic import command

    cfg = _alembic_config(engine)
    if engine.dialect.name != "postgresql":
        command.upgrade(cfg, revision)
        return
    with engine.connect() as conn:
        try:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
            conn.commit()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
            conn.commit()
        except BaseException:
            # Never back to the pool still holding the lock: a closed session frees it.
            conn.invalidate()
            raise


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
