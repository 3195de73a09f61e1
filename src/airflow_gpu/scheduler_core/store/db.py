"""Engines, sessions and migrations (`airflow-gpu db upgrade`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, exc, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InputError
from .sqlitefiles import check_writable

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


# The connection budget of one process (docs/service.md, "Connection budget"). The API runs
# its routes in anyio's default thread pool (40 threads, FastAPI's run_in_threadpool), and
# the scheduling loop runs its passes on one thread more: a pool of 41 never makes a thread
# wait for a connection. The leader's lock connection is opened outside the pool.
API_THREADS = 40
POOL_SIZE = API_THREADS + 1
POOL_SIZE_ENV = "AIRFLOW_GPU_DB_POOL_SIZE"
# How long a request waits for a pooled connection before it answers 503 (Retry-After).
POOL_TIMEOUT = 30.0
POOL_TIMEOUT_ENV = "AIRFLOW_GPU_DB_POOL_TIMEOUT"

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


def pool_timeout_from(value: str | float | None,
                      what: str = "--db-pool-timeout") -> float | None:
    """Seconds to wait for a pooled connection (0.1 to 600); None when unset."""
    if value is None or value == "":
        return None
    try:
        t = float(value)
    except ValueError:
        raise InputError(f"{what}: {value!r} is not a number of seconds") from None
    if not 0.1 <= t <= 600:
        raise InputError(f"{what}: {t:g} is out of bounds; use 0.1 to 600 seconds (default "
                         f"{POOL_TIMEOUT:g})")
    return t


def make_engine(url: str, writes: bool = True, pool_size: int | None = None) -> Engine:
    """An engine for `url` (sqlite:///FILE or postgresql+psycopg://...).

    On SQLite, `writes` engines begin every transaction with the write lock; `writes=False`
    gives an engine for reads only, which WAL lets run beside a writer. On PostgreSQL the
    pool holds at most `pool_size` connections (else $AIRFLOW_GPU_DB_POOL_SIZE, else
    POOL_SIZE), never more; a thread waits for one at most $AIRFLOW_GPU_DB_POOL_TIMEOUT
    (else POOL_TIMEOUT) seconds. `airflow-gpu server` sizes the pool from the database
    server's max_connections at start-up (budget.py)."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = _create(url, connect_args={"timeout": 30})

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
    wait = pool_timeout_from(os.environ.get(POOL_TIMEOUT_ENV), POOL_TIMEOUT_ENV) \
        or POOL_TIMEOUT
    return _create(url, pool_size=size, max_overflow=0, pool_timeout=wait,
                   pool_recycle=3600)


_EXAMPLES = "sqlite:///path/to/file.db or postgresql+psycopg://user@host/db"


def shown_url(url: str | URL) -> str:
    """The URL as messages show it: its password hidden."""
    try:
        return repr(make_url(url).render_as_string(hide_password=True))
    except (exc.ArgumentError, ValueError, TypeError):     # unparsable: mask it by hand
        text = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))
        return repr(text if len(text) <= 100 else f"{text[:97]}...")


def parse_url(url: str) -> URL:
    """The URL, or an InputError naming what is wrong with it."""
    if not url.startswith(("sqlite", "postgresql")):
        shown = shown_url(url) if "://" in url else repr(url[:60])
        raise InputError(f"--db: {shown} is not a SQLite or PostgreSQL URL; use {_EXAMPLES}")
    try:
        return make_url(url)
    except (exc.ArgumentError, ValueError):     # (their text may hold the password)
        raise InputError(f"--db: {shown_url(url)} is not a database URL (check the "
                         f"user:password@host:port part); use {_EXAMPLES}") from None


def _create(url: str, **options) -> Engine:
    try:
        return create_engine(url, **options)
    except exc.NoSuchModuleError:
        raise InputError(f"--db: {shown_url(url)}: unknown database driver; use "
                         f"{_EXAMPLES}") from None
    except ModuleNotFoundError as e:
        raise InputError(f"--db: the driver of {shown_url(url)} is not installed ({e.name}); "
                         "use postgresql+psycopg://... (psycopg 3, installed with "
                         "airflow-provider-gpu)") from None
    except (exc.ArgumentError, ValueError, TypeError):
        raise InputError(f"--db: {shown_url(url)} is not a database URL; use "
                         f"{_EXAMPLES}") from None


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for a PostgreSQL one). A URL that names no file
    (`sqlite://`, `sqlite://name.db` with two slashes, `:memory:`) would open an empty
    in-memory database that is gone when the command ends: refused."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if parsed.query.get("uri") in ("true", "1"):          # sqlite:///file:...?uri=true
        return None
    if parsed.host or not parsed.database or parsed.database == ":memory:":
        slashes = (f" ({parsed.host!r} is read as a host: SQLite URLs have three slashes, "
                   f"sqlite:///{parsed.host}{'/' + parsed.database if parsed.database else ''}"
                   ")" if parsed.host else "")
        raise InputError(f"--db: {shown_url(url)} names no database file{slashes}; an "
                         "in-memory database is gone when the command ends; use "
                         "sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return Path(parsed.database)


def check_database_url(url: str, create: bool | None) -> None:
    """Before a command opens `url`: a SQLite file's folder must exist, and the file too
    unless `create` (a mistyped path would otherwise start a new, empty database); None:
    the command has no --create to suggest."""
    path = sqlite_file(url)
    if path is None:
        return
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise InputError(f"--db: the folder of the SQLite file, {str(folder)!r}, {what}; "
                         f"create it (mkdir -p {folder}) or fix the path in the URL")
    if path.is_dir():
        raise InputError(f"--db: {str(path)!r} is a folder, not a SQLite file; name the file "
                         "in it, e.g. sqlite:///" + str(path / "airflow-gpu.db"))
    if not create and not path.exists():
        raise InputError(f"--db: the SQLite file {str(path)!r} does not exist; create the "
                         f"database with `airflow-gpu db upgrade --db {url}` first"
                         + (", or pass --create (a mistyped path would otherwise start a "
                            "new, empty database)" if create is not None else ""))
    check_writable(path)        # not immutable: SQLite would die on its -shm (SIGBUS)


def _reason(error: BaseException) -> str:
    """The driver's message on one line, at most 300 characters."""
    text = " ".join(str(getattr(error, "orig", None) or error).split())
    return text if len(text) <= 300 else f"{text[:297]}..."


@contextmanager
def database_errors(url: str) -> Iterator[None]:
    """A database that cannot be reached or opened, as an InputError naming it (one line,
    the driver's reason and the fix) instead of a traceback."""
    try:
        yield
    except (exc.OperationalError, exc.InterfaceError) as e:
        reason = _reason(e)
        if url.startswith("sqlite"):
            fix = ("check the path, and that the file and its folder are readable and "
                   "writable")
        else:
            fix = ("check that the database server runs and the URL's host, port, user, "
                   "password and database name")
        raise InputError(f"--db: cannot use the database {shown_url(url)}: {reason}; "
                         f"{fix}") from None
    except exc.DatabaseError as e:
        if type(e) is not exc.DatabaseError:      # integrity, programming errors: bugs
            raise
        raise InputError(f"--db: cannot use the database {shown_url(url)}: {_reason(e)}; "
                         "check that the URL names an airflow-gpu database") from None


def open_database(url: str, create: bool | None = False) -> Engine:
    """An engine on `url`, checked: the SQLite file exists (or `create`; None: the command
    has no --create), the database answers. Errors are InputErrors naming the URL and the
    fix."""
    check_database_url(url, create)
    engine = make_engine(url)
    try:
        with database_errors(url), engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA schema_version")   # "file is not a database"
    except BaseException:
        engine.dispose()
        raise
    return engine


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


def head_revision() -> str:
    """The newest migration's revision: each file in versions/ is named after its own
    (`0014_grant_time_indexes.py` is revision 0014; a test holds them to it)."""
    return max(p.name.split("_", 1)[0] for p in (MIGRATIONS / "versions").glob("[0-9]*_*.py"))


def at_revision(engine: Engine, revision: str) -> bool:
    """Whether the schema is at `revision`, read without Alembic (a database with no
    schema yet is at none)."""
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")
                                ).scalars().all() == [revision]
    except exc.DBAPIError:
        return False


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (idempotent). On PostgreSQL under an advisory lock,
    on the connection Alembic migrates with: replicas (or `--workers`) starting together
    on a fresh database wait for the first one's migrations, then find nothing to do.
    A schema already at head is left as it is without importing Alembic (about 0.15 s of
    CPU off each command that opens the database)."""
    if revision == "head" and at_revision(engine, head_revision()):
        return
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


# the tables `snapshot(write=True)` locks against other writers (store/repair.py)
HOLD_TABLES = "allocations, gpu_holds, mig_holds, cpu_holds"


@contextmanager
def snapshot(engine: Engine, write: bool = False, wait: bool = True) -> Iterator[Session]:
    """One transaction whose reads see one committed state (PostgreSQL: REPEATABLE READ;
    SQLite's transaction is one already); `write`: with the hold and
    allocation tables locked against other writers first (`wait`: for those in flight)."""
    with sessions(engine).begin() as s:
        if engine.dialect.name == "postgresql":
            s.connection(execution_options={"isolation_level": "REPEATABLE READ",
                                            "postgresql_readonly": not write})
            if write:
                # NOWAIT: never queued behind a writer while others queue behind this
                # lock (a pass waiting on it can hold what the writer waits for)
                s.execute(text(f"LOCK TABLE {HOLD_TABLES} IN SHARE ROW EXCLUSIVE MODE"
                               + ("" if wait else " NOWAIT")))
        yield s
