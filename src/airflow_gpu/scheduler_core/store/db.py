"""Engines, sessions and migrations (`airflow-gpu db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InputError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def make_engine(url: str, writes: bool = True) -> Engine:
    """An engine for `url` (sqlite:///FILE or postgresql+psycopg://...).

    On SQLite, `writes` engines begin every transaction with the write lock; `writes=False`
    gives an engine for reads only, which WAL lets run beside a writer."""
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

        return engine
    # A pool as large as the API's worker threads (anyio's 40): no connection is opened
    # per request. No pre-ping (a round trip per checkout): after a database restart
    # the first statement on each old connection fails and the pool replaces them all.
    return create_engine(url, pool_size=40, max_overflow=10, pool_recycle=3600)


def sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _alembic_config(engine: Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (idempotent)."""
    from alembic import command

    command.upgrade(_alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
