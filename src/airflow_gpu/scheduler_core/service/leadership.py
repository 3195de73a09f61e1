"""The scheduling loop's leader election. With PostgreSQL, the replicas of one
deployment elect one scheduler: a replica leads while it holds the deployment's lease, a
row of the `leader_lease` table with the holder, a fencing token and an expiry measured
with the database's clock, renewed each round by the leader.

A replica takes the lease when it gets the deployment's advisory lock, held on a
connection of its own: when the leader dies its connection closes, the lock frees, and
another replica takes it on its next tick. A leader that is frozen (SIGSTOP, a paused VM,
a partition) keeps its lock but cannot renew its lease: once the lease has expired,
another replica takes it over without the lock. Each takeover increments the token, and
every pass's transaction first locks the lease row with the leader's token (`fence`), so
a frozen leader that wakes never writes: no two leaders ever write.

The lock's key is a hash of the deployment: its configured name (`--deployment`), else
the schema its tables are in, so deployments sharing a database in different schemas
each schedule. The lock connection's application_name names the host and process, so
the other replicas (and /healthz) can say who holds it."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading

from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

# the loop's logger: its lines keep the name operators filter on
log = logging.getLogger("airflow_gpu.scheduler_core.service.loop")

# The backend holding an advisory lock taken with a bigint key: pg_locks shows the key's
# high 32 bits as classid and its low ones as objid, with objsubid 1.
_HOLDER = text("""
    SELECT a.pid, host(a.client_addr) AS client_addr, a.application_name, a.backend_start
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = :hi AND l.objid::bigint = :lo
    LIMIT 1""")

# The lease (table leader_lease, one row per deployment); every expiry is measured with
# the database's clock, so the replicas' clocks never matter.
_LEASE_FOR = "clock_timestamp() + make_interval(secs => :lease)"
# With the advisory lock: the lease is this replica's once it has expired or its holder's
# backend is gone (it died, or gave the lock up), so a dead leader is replaced at once.
# A pass of the old leader still in flight holds the row locked: this waits for it to
# commit, and its next pass finds the token changed.
_ACQUIRE = text(f"""
    INSERT INTO leader_lease AS l (deployment, holder, pid, token, acquired_at, expires_at)
    VALUES (:d, :holder, pg_backend_pid(), 1, clock_timestamp(), {_LEASE_FOR})
    ON CONFLICT (deployment) DO UPDATE SET holder = excluded.holder, pid = excluded.pid,
        token = l.token + 1, acquired_at = excluded.acquired_at,
        expires_at = excluded.expires_at
    WHERE l.expires_at <= clock_timestamp()
       OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid)
    RETURNING l.token""")
# Without it: only a lease that has expired (its holder is frozen or cut off).
_TAKE_OVER = text(f"""
    UPDATE leader_lease SET holder = :holder, pid = pg_backend_pid(), token = token + 1,
        acquired_at = clock_timestamp(), expires_at = {_LEASE_FOR}
    WHERE deployment = :d AND expires_at <= clock_timestamp()
    RETURNING token""")
# The leader, each round: as long as nobody took over (the token is still this one's).
_RENEW = text(f"""
    UPDATE leader_lease SET expires_at = {_LEASE_FOR}
    WHERE deployment = :d AND token = :t
    RETURNING token""")
# First in every pass's (and lease check's) transaction: lock the row, still this
# leader's and unexpired; no takeover can then happen before it commits. A key-share
# lock: a lease check never waits for a pass in flight, and the leader's renewal (an
# UPDATE of expires_at alone: a no-key update) never waits for either, so a long write
# cannot starve the renewals; a takeover locks the row FOR UPDATE first (`_CLAIM`), which
# waits for every fenced transaction to commit.
_FENCE = text("""
    SELECT token FROM leader_lease
    WHERE deployment = :d AND token = :t AND expires_at > clock_timestamp()
    FOR KEY SHARE""")
_CLAIM = text("SELECT 1 FROM leader_lease WHERE deployment = :d FOR UPDATE")
_LEASE = text("""
    SELECT l.holder, l.pid, l.token, l.expires_at > clock_timestamp() AS live,
           l.expires_at <= clock_timestamp() AS expired, host(a.client_addr) AS client_addr,
           a.application_name, a.backend_start
    FROM leader_lease l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.deployment = :d""")
_GIVE_UP = text("""
    UPDATE leader_lease SET expires_at = clock_timestamp()
    WHERE deployment = :d AND token = :t""")
# Bounds on what a lease statement may wait for, this transaction only: a row locked by a
# frozen process, or this session frozen inside a transaction (the database ends it).
_TIMEOUTS = text("SELECT set_config('lock_timeout', :lock, true), "
                 "set_config('idle_in_transaction_session_timeout', :idle, true)")

LEASE_MIN = 5.0      # seconds: the shortest default lease
KEEP_AT_MOST = 600.0     # seconds a pass may decide with its lease kept: past it, hung


class NotLeader(RuntimeError):
    """This replica's lease was taken over (or ran out): its pass writes nothing."""


def lease_seconds(settings, interval: float, coalesce: float) -> float:
    """How long a lease lasts unrenewed: `leader_lease` of the settings, else the
    AIRFLOW_GPU_LEADER_LEASE environment variable, else 3 scheduling rounds (interval and
    the gathering wait), at least LEASE_MIN. It bounds how long a frozen leader blocks
    scheduling and how long a pass's transaction may sit idle (the database ends it); a
    pass deciding for longer keeps its lease (`kept`)."""
    configured = getattr(settings, "leader_lease", None)
    env = os.environ.get("AIRFLOW_GPU_LEADER_LEASE")
    if configured is None and env:
        try:
            configured = float(env)
        except ValueError:
            raise ValueError(f"AIRFLOW_GPU_LEADER_LEASE: {env!r} is not a number of "
                             "seconds") from None
    if configured is not None:
        if not 0.5 <= configured <= 3600:
            raise ValueError(f"the leader lease: {configured:g}s is out of bounds (0.5 to "
                             "3600 seconds)")
        return float(configured)
    return max(3 * (interval + coalesce), LEASE_MIN)


def _lock_timeout(exc: BaseException) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "55P03"


def lock_key(deployment: str) -> int:
    """The advisory-lock key of a deployment ("schema NAME" or "deployment NAME"): a
    signed 64-bit hash, as pg_try_advisory_lock(bigint) takes it."""
    digest = hashlib.sha256(f"airflow-gpu scheduler/{deployment}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def application_name() -> str:
    """What the lock connection shows in pg_stat_activity (PostgreSQL keeps 63 bytes)."""
    return f"airflow-gpu scheduler {socket.gethostname()} pid {os.getpid()}"[:63]


class Leadership:
    """The election's half of SchedulerLoop (its state is set in SchedulerLoop.__init__):
    take, renew, fence and give up the deployment's lease."""

    def _give_up(self) -> None:
        """Stopping: hand the lease back at once (the successor need not wait it out)."""
        if self._lock_conn is not None and self.token is not None:
            with contextlib.suppress(Exception):
                self._lock_conn.execute(_GIVE_UP, {"d": self.deployment, "t": self.token})
                self._lock_conn.commit()
        self._release()
        if self._lock_engine is not None:
            self._lock_engine.dispose()

    def fence(self, s) -> None:
        """First in every pass's transaction (storepass.run_pass): lock the lease row with
        this leader's token, still unexpired, or raise NotLeader (the pass writes nothing).
        The row stays locked until the pass commits, so no replica takes over meanwhile;
        the transaction may not sit idle longer than the lease (a leader frozen inside it
        is ended by the database, its row locks freed). A no-op on SQLite, and for passes
        run by hand by a loop that never took part in an election."""
        if not self._elected or self.service.engine.dialect.name != "postgresql":
            return
        token = self.token
        if token is None:
            raise NotLeader("this replica does not hold the scheduler lease; its pass "
                            "writes nothing")
        ms = str(round(self.lease * 1000))
        s.execute(_TIMEOUTS, {"lock": ms, "idle": ms})
        if s.execute(_FENCE, {"d": self.deployment, "t": token}).scalar() is None:
            self.token = None
            raise NotLeader(f"the scheduler lease (fencing token {token}) was taken over "
                            "or ran out; this replica stops scheduling and its pass wrote "
                            "nothing")

    @contextlib.contextmanager
    def kept(self):
        """While a pass runs (storepass.py), renew the lease every third of it, so a long
        pass (a cold read of a long queue, a big write) never lets it run out while this
        replica lives: a renewal does not wait for the pass's fenced transactions. A
        frozen process renews nothing, and a pass hung for KEEP_AT_MOST is kept no
        longer: takeovers stay as they were."""
        if not self._elected or self._lock_conn is None:
            yield
            return
        done = threading.Event()
        every = max(self.lease / 3, 0.1)

        def keep() -> None:     # the only user of the lock connection until joined
            for _ in range(int(KEEP_AT_MOST / every)):
                if done.wait(every) or self.token is None:
                    return
                try:
                    if not self._renew():
                        return            # taken over: the write's fence refuses it
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        self._lock_conn.rollback()
                    if not _lock_timeout(exc):
                        log.warning("%s: renewing the scheduler lease during a long pass "
                                    "failed (%s); the pass writes only if the lease is "
                                    "still this replica's", self.deployment, exc)
                        return

        t = threading.Thread(target=keep, name="scheduler-lease-keeper", daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join()                    # the lock connection is the loop's again

    def _lead(self) -> bool:
        engine = self.service.engine
        if engine.dialect.name != "postgresql":
            self.leader = True          # SQLite: one process
            return True
        self._elected = True
        if self._lock_conn is not None and self.token is None:
            self._release()             # a lease check's fence found the lease taken over
            return False
        if self._lock_conn is not None:
            try:
                if self._renew():
                    return True
                self._release()         # taken over: not again this round, whatever
                return False            # the lock does
            except Exception as exc:
                if _lock_timeout(exc):  # the row is locked (a takeover in flight): next round
                    self._lock_conn.rollback()
                    return True
                log.warning("%s: the scheduler lock's connection failed; this replica stops "
                            "scheduling until it gets the lock again", self.deployment)
            self._release()
        if self._lock_engine is None:     # a connection of its own, never pooled
            self._lock_engine = create_engine(
                engine.url, poolclass=NullPool,
                connect_args={"application_name": self.app_name})
        conn = self._lock_engine.connect()
        try:
            if self.lock_key is None:
                if self.deployment is None:
                    schema = conn.execute(text("SELECT current_schema()")).scalar()
                    self.deployment = f"schema {schema or 'public'}"
                self.lock_key = lock_key(self.deployment)
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                               {"k": self.lock_key}).scalar()
            self._bounded(conn)
            args = {"d": self.deployment, "holder": self.app_name, "lease": self.lease}
            lease = conn.execute(_LEASE, {"d": self.deployment}).mappings().first()
            if got or (lease and lease["expired"]):
                conn.execute(_CLAIM, {"d": self.deployment})  # no fenced write in flight
            if got:
                token = conn.execute(_ACQUIRE, args).scalar()
            else:
                token = (conn.execute(_TAKE_OVER, args).scalar()
                         if lease and lease["expired"] else None)
            if token is not None:
                self.lock_pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
                conn.commit()
                self._lock_conn, self.leader, self.holder = conn, True, None
                self.token, self.has_lock, self._holder_seen = token, bool(got), False
                if got:
                    log.info("%s: this replica schedules now (advisory lock key %d, backend "
                             "pid %s, application_name %r, fencing token %d, lease %gs)",
                             self.deployment, self.lock_key, self.lock_pid, self.app_name,
                             token, self.lease)
                else:
                    log.warning("%s: the scheduler lease of %s (backend pid %s) expired "
                                "while it still holds advisory lock key %d (frozen or cut "
                                "off?); this replica takes over and schedules now (backend "
                                "pid %s, fencing token %d, lease %gs): the old leader "
                                "cannot write any more", self.deployment, lease["holder"],
                                lease["pid"], self.lock_key, self.lock_pid, token, self.lease)
                return True
            # Not this replica's (closing the connection frees the lock if it got it: the
            # live lease's holder then gets it too).
            k = self.lock_key & (2**64 - 1)
            found = conn.execute(_HOLDER, {"hi": k >> 32, "lo": k & 0xFFFFFFFF}).mappings().first()
            conn.commit()
        except BaseException as exc:
            conn.close()                  # NullPool: really closed, the lock freed
            if isinstance(exc, OperationalError) and _lock_timeout(exc):
                self.leader = False       # the lease row is locked: a pass or takeover
                return False              # in flight; the next round tries again
            raise
        conn.close()
        self.leader = False
        self._saw(self._seen(dict(found) if found else None, lease))
        return False

    def _bounded(self, conn) -> None:
        """This transaction of the lock connection waits at most a second for the lease
        row and may sit idle at most a lease (frozen in it, the database ends it)."""
        conn.execute(_TIMEOUTS, {"lock": str(round(min(1.0, self.lease / 2) * 1000)),
                                 "idle": str(round(self.lease * 1000))})

    def _renew(self) -> bool:
        """The leader's round: renew the lease (and try for the advisory lock where it
        leads without it); False when another replica took the lease over."""
        conn = self._lock_conn
        if not self.has_lock and conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                              {"k": self.lock_key}).scalar():
            self.has_lock = True
            log.info("%s: this replica now holds advisory lock key %d too",
                     self.deployment, self.lock_key)
        self._bounded(conn)
        renewed = conn.execute(_RENEW, {"d": self.deployment, "t": self.token,
                                        "lease": self.lease}).scalar()
        conn.commit()
        if renewed is None:
            log.warning("%s: another replica took the scheduler lease over (this one's "
                        "fencing token %d is stale: it was frozen or cut off for longer than "
                        "the %gs lease); this replica stops scheduling and writes nothing",
                        self.deployment, self.token, self.lease)
            self.token = None
            return False
        return True

    def _seen(self, locker: dict | None, lease) -> dict | None:
        """Who schedules, as a waiting replica sees it: the advisory lock's holder, unless
        another backend holds the live lease (it took over from a frozen leader)."""
        if lease is None or not lease["live"] or (locker and locker["pid"] == lease["pid"]):
            return locker
        return {"pid": lease["pid"], "client_addr": lease["client_addr"],
                "application_name": lease["application_name"] or lease["holder"],
                "backend_start": lease["backend_start"], "lease_token": lease["token"]}

    def _saw(self, holder: dict | None) -> None:
        """Remember (and log when it changes) who holds the lock this replica did not get."""
        if holder and holder.get("backend_start") is not None:
            holder["backend_start"] = holder["backend_start"].isoformat()
        if self._holder_seen and holder == self.holder:
            return
        self.holder, self._holder_seen = holder, True
        if holder and "lease_token" in holder:
            log.info("%s: another replica schedules: backend pid %s (%s, client %s) holds the "
                     "scheduler lease (fencing token %s) taken over from a leader whose lease "
                     "expired; this one takes over when that lease expires",
                     self.deployment, holder["pid"], holder["application_name"],
                     holder["client_addr"] or "local socket", holder["lease_token"])
        elif holder:
            log.info("%s: another replica schedules: advisory lock key %d is held by backend "
                     "pid %s (%s, client %s, connected %s); this one takes over when it stops "
                     "or its lease expires",
                     self.deployment, self.lock_key, holder["pid"],
                     holder["application_name"] or "no application_name",
                     holder["client_addr"] or "local socket", holder["backend_start"])
        else:
            log.warning("%s: advisory lock key %d is held by a backend that pg_stat_activity "
                        "does not show to this database role (or was just released)",
                        self.deployment, self.lock_key)

    def _release(self) -> None:
        if self._lock_conn is not None:
            with contextlib.suppress(Exception):   # the connection may be dead already
                # Invalidate, not close: a closed connection goes back to the pool still
                # holding the session's advisory lock, and no replica (this one neither)
                # could ever lead again.
                self._lock_conn.invalidate()
                self._lock_conn.close()
        self._lock_conn, self.leader, self.lock_pid = None, False, None
        self.token, self.has_lock = None, False
        self.service.warm = None          # leading again, it reads the store anew
