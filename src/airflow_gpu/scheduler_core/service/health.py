"""What /healthz reports (who schedules, when the last pass completed, why passes fail)
and what the API answers when the database cannot store anything (a full disk, a
read-only database): 503 with Retry-After and what is wrong, not 500."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

WARN_AFTER = 3        # scheduling rounds without a completed pass before /healthz warns
RETRY_AFTER = 10      # seconds a client is told to wait when the database cannot write

log = logging.getLogger(__name__)


class Failures:
    """What failed (a pass, the leader election check, a lease check) since it last
    succeeded, for /healthz. Each failure is logged: a database's, or an expected conflict
    (`expected`), in one line with its cause (the traceback at DEBUG), anything else with
    its traceback."""

    def __init__(self, logger: logging.Logger):
        self.log = logger
        self._errors: dict[str, dict] = {}

    @property
    def last(self) -> dict | None:
        """The latest failure not followed by a success of its kind: message, at, during."""
        return max(self._errors.values(), key=lambda e: e["at"], default=None)

    def failed(self, exc: BaseException, during: str, who: str) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        why = describe(exc)
        self._errors[during] = {"message": why, "at": time.time(), "during": during}
        what = f"{who}: {_DURING[during]} failed"
        if isinstance(exc, SQLAlchemyError) or expected(exc):
            self.log.error("%s: %s", what, why)
            self.log.debug("%s", what, exc_info=exc)
        else:
            self.log.error("%s", what, exc_info=exc)

    def succeeded(self, *kinds: str) -> None:
        for kind in kinds:
            self._errors.pop(kind, None)


def report(loop, now: float | None = None) -> dict:
    """/healthz: `scheduling` (this replica leads), the deployment and its lock key, the
    leader (this replica, or the backend holding the lock as pg_stat_activity shows it),
    who runs the passes (`passes_by`: this replica, or the leader's application_name),
    seconds since this replica's last completed pass, this replica's last error since
    (and `during` what: its pass, its leader election check, its lease check), and a
    `warning` when passes have stopped where this replica should see them run."""
    now = time.time() if now is None else now
    if loop.leader:
        leader = {"this_replica": True, "pid": loop.lock_pid,
                  "application_name": loop.app_name if loop.lock_pid else None}
    else:
        leader = {"this_replica": False, **loop.holder} if loop.holder else None
    error = _error(loop)
    warn = _warning(loop, leader, error, now)
    loop.note_quiet(warn)          # logged too (when it starts, then once a minute)
    return {"status": "ok", "scheduling": loop.leader, "deployment": loop.deployment,
            "lock_key": loop.lock_key, "leader": leader, "passes_by": _passes_by(loop, leader),
            "seconds_since_last_pass": None if loop.last_pass_at is None
            else round(now - loop.last_pass_at, 3),
            "passes": loop.passes, "last_pass_seconds": round(loop.last_pass, 4),
            "last_pass_phases": _phases(loop),
            "last_pass_error": error, "warning": warn}


def _phases(loop) -> dict | None:
    """The seconds each part of the last pass took, and whether it explained."""
    phases = loop.service.pass_phases
    if phases is None:
        return None
    return {"explained": phases.explained,
            **{k: round(v, 4) for k, v in phases.seconds.items()}}


def warning(loop, now: float | None = None) -> str | None:
    """The warning /healthz would give now (the loop logs it between passes)."""
    now = time.time() if now is None else now
    leader = {"this_replica": loop.leader} if loop.leader or loop.holder else None
    return _warning(loop, leader, _error(loop), now)


def _passes_by(loop, leader: dict | None) -> str | None:
    if leader is None:            # SQLite: one process schedules, whatever just failed
        return "this replica" if loop.service.engine.dialect.name == "sqlite" else None
    if leader["this_replica"]:
        return "this replica"
    return leader.get("application_name") or f"backend pid {leader.get('pid')}"


def _error(loop) -> dict | None:
    error = loop.last_error
    return error and {"message": error["message"], "at": _iso(error["at"]),
                      "during": f"this replica's {_DURING[error['during']]}"}


_DURING = {"pass": "scheduling pass", "election": "leader election check",
           "lease check": "lease check"}


def _warning(loop, leader: dict | None, error: dict | None, now: float) -> str | None:
    since = loop.last_pass_at or loop.started_at
    if since is None:             # no loop runs in this process and no pass ran here
        return None
    if leader is not None and not leader["this_replica"]:
        return None               # another replica schedules; its /healthz speaks for it
    quiet = now - since
    # a round: the interval, the wait that gathers bursts of requests, and the pass itself
    limit = WARN_AFTER * (loop.interval + loop.MAX_COALESCE + loop.last_pass)
    if quiet <= limit:
        return None
    what = (f"no scheduling pass has completed for {quiet:.1f}s (over {WARN_AFTER} rounds "
            f"of the {loop.interval:g}s interval: {limit:.1f}s)")
    if error:
        return f"{what}: the last one failed at {error['at']}: {error['message']}"
    if not loop.leader:
        return (f"{what}: this replica does not hold the scheduler lock and no replica is "
                "seen holding it (check the other replicas' logs and /healthz)")
    return f"{what}: this replica leads; its loop may be stuck in a long pass or stopped"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _driver_error(exc: BaseException) -> tuple[BaseException, str, str, int]:
    """The driver's error under a SQLAlchemy one, its first line, PostgreSQL's SQLSTATE
    (psycopg) and SQLite's primary result code ("" and 0 where the other database)."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    state = getattr(orig, "sqlstate", None) or ""
    code = (getattr(orig, "sqlite_errorcode", None) or 0) & 0xFF
    return orig, first, state, code


def storage_problem(exc: BaseException) -> str | None:
    """What is wrong when the database cannot store changes (a full disk, a read-only
    database, PostgreSQL out of resources), with the fix; None for other errors."""
    _, first, state, code = _driver_error(exc)
    if state == "53100" or code == 13 or "database or disk is full" in first:
        return (f"the database cannot store anything: its disk is full ({first}). Free "
                "space on the volume that holds the database (or raise its size limit); "
                "nothing was changed, retry after that")
    if state == "25006" or code == 8 or "read-only" in first or "readonly" in first:
        return (f"the database refuses writes: it is read-only ({first}). Point --db at "
                "the writable primary (after a failover, say) or make the database file "
                "and its folder writable; nothing was changed, retry after that")
    if state.startswith("53"):
        return (f"the database is out of resources ({first}); nothing was changed, retry "
                "later")
    return None


def unavailable(exc: BaseException) -> str | None:
    """What is wrong when the database cannot be reached or used right now (down,
    restarting, dropped, its files unreadable), so that a retry later may succeed; None
    for other errors (faults of the service: 500)."""
    orig, first, state, code = _driver_error(exc)
    postgres = type(orig).__module__.startswith("psycopg")
    if (getattr(exc, "connection_invalidated", False) or state.startswith("08")
            or state in ("57P01", "57P02", "57P03", "3D000")
            or (postgres and not state and type(orig).__name__ == "OperationalError")):
        return (f"the database cannot be reached ({first or type(orig).__name__}); nothing "
                "was changed, retry later")
    if code in (5, 6, 10, 14) or any(m in first for m in (
            "disk I/O error", "unable to open database file", "database is locked")):
        return (f"the database cannot be used right now ({first}); nothing was changed, "
                "retry later")
    return None


def readiness(loop, service, now: float | None = None) -> tuple[bool, dict]:
    """/readyz: a write that commits, through the pool the API uses (so a read-only,
    full, unreachable or locked database fails it), and scheduling: the leader's last
    completed pass within 3 rounds (this replica's, when it leads; else the leader's
    lease as the database holds it, renewed each round)."""
    now = time.time() if now is None else now
    problems: list[str] = []
    t0 = time.perf_counter()
    try:
        lease = _write_round_trip(service, loop)
        database = {"ok": True, "seconds": round(time.perf_counter() - t0, 3)}
    except Exception as exc:          # noqa: BLE001 - the answer names it
        lease = None
        database = {"ok": False, "error": describe(exc)}
        problems.append(f"the database cannot write: {database['error']}")
    scheduling = _scheduling(loop, lease, now)
    if scheduling.get("problem"):
        problems.append(scheduling["problem"])
    return not problems, {"status": "ready" if not problems else "not ready",
                          "problems": problems, "database": database,
                          "scheduling": scheduling}


_READY_LIMITS = "SELECT set_config('lock_timeout', '2s', true), " \
                "set_config('statement_timeout', '5s', true)"
# A write that changes nothing (the schema's revision set to itself) and commits: it needs
# the write lock (SQLite: BEGIN IMMEDIATE) and a writable, not read-only, database.
_TOUCH = "UPDATE alembic_version SET version_num = version_num"
_LEASE = ("SELECT EXTRACT(EPOCH FROM clock_timestamp() - expires_at) FROM leader_lease "
          "WHERE deployment = :d")


def _write_round_trip(service, loop) -> float | None:
    """Commit the write above; on PostgreSQL, in the same transaction, how many seconds
    ago the deployment's leader lease expired (negative: it is live; None: no lease)."""
    from sqlalchemy import inspect, text

    engine = service.engine
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            raw = conn.connection.driver_connection
            raw.execute("PRAGMA busy_timeout = 5000")    # wait for a pass, not 30s
            try:
                conn.execute(text(_TOUCH))
                conn.commit()
            finally:
                raw.execute("PRAGMA busy_timeout = 30000")
            return None
        conn.execute(text(_READY_LIMITS))
        conn.execute(text(_TOUCH))
        overdue = None
        if not loop.leader and loop.deployment and inspect(conn).has_table("leader_lease"):
            overdue = conn.execute(text(_LEASE), {"d": loop.deployment}).scalar()
        conn.commit()
        return None if overdue is None else float(overdue)


def _scheduling(loop, overdue: float | None, now: float) -> dict:
    if loop.started_at is None and loop.last_pass_at is None:
        return {"checked": False, "why": "no scheduling loop runs in this process"}
    if loop.leader or overdue is None:
        warn = warning(loop, now)     # this replica leads, or it sees no lease
        last = None if loop.last_pass_at is None else round(now - loop.last_pass_at, 3)
        out = {"checked": True, "this_replica": bool(loop.leader),
               "seconds_since_last_pass": last}
        return {**out, "problem": warn} if warn else out
    out = {"checked": True, "this_replica": False,
           "leader_lease_expired_seconds_ago": round(overdue, 3) if overdue > 0 else None}
    if overdue > 0:
        out["problem"] = (f"no replica is scheduling: the leader's lease expired "
                          f"{overdue:.1f}s ago (it renews it each round)")
    return out


def expected(exc: BaseException) -> bool:
    """A conflict the pass meets in normal running (a job requeued while the pass had it
    queued): one line is all it says; a traceback would bury the real failures'."""
    from ..policy.jobqueue import NameTaken

    return isinstance(exc, NameTaken)


def describe(exc: BaseException) -> str:
    """An error in one line: what the database says, or the exception's first line."""
    why = storage_problem(exc) or unavailable(exc)
    if why:
        return why
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first}" if first else type(orig).__name__
