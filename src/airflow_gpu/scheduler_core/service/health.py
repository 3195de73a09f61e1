"""What /healthz reports (who schedules, when the last pass completed, why passes fail)
and what the API answers when the database cannot store anything (a full disk, a
read-only database): 503 with Retry-After and what is wrong, not 500."""

from __future__ import annotations

import time
from datetime import UTC, datetime

WARN_AFTER = 3        # scheduling rounds without a completed pass before /healthz warns
RETRY_AFTER = 10      # seconds a client is told to wait when the database cannot write


def report(loop, now: float | None = None) -> dict:
    """/healthz: `scheduling` (this replica leads), the deployment and its lock key, the
    leader (this replica, or the backend holding the lock as pg_stat_activity shows it),
    seconds since this replica's last completed pass, the last pass error since, and a
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
            "lock_key": loop.lock_key, "leader": leader,
            "seconds_since_last_pass": None if loop.last_pass_at is None
            else round(now - loop.last_pass_at, 3),
            "last_pass_error": error, "warning": warn}


def warning(loop, now: float | None = None) -> str | None:
    """The warning /healthz would give now (the loop logs it between passes)."""
    now = time.time() if now is None else now
    leader = {"this_replica": loop.leader} if loop.leader or loop.holder else None
    return _warning(loop, leader, _error(loop), now)


def _error(loop) -> dict | None:
    return loop.last_error and {"message": loop.last_error["message"],
                                "at": _iso(loop.last_error["at"])}


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


def storage_problem(exc: BaseException) -> str | None:
    """What is wrong when the database cannot store changes (a full disk, a read-only
    database, PostgreSQL out of resources), with the fix; None for other errors."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    state = getattr(orig, "sqlstate", None) or ""             # PostgreSQL (psycopg)
    code = (getattr(orig, "sqlite_errorcode", None) or 0) & 0xFF   # SQLite primary code
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


def describe(exc: BaseException) -> str:
    """An error in one line: what the database says, or the exception's first line."""
    why = storage_problem(exc)
    if why:
        return why
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first}" if first else type(orig).__name__
