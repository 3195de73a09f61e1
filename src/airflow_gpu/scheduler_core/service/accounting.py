"""Per-job GPU accounting: each node agent report is attributed, GPU by GPU, to the job
holding the GPU (the service knows the holds), and integrated into the job's usage rows:
sampled seconds, utilization x seconds (trapezoids between consecutive samples), peak
utilization and memory, energy (the GPU's energy counter where it reports one, else the
power integrated) and the time at zero utilization. Gaps longer than the host timeout
(the host was unreachable) are not integrated. The job's series for the UI gets a point
from the first report of each SERIES_STEP (UTC-aligned, as the series is read) per host.

A report costs the same few statements however many jobs hold the host's GPUs: the
holds with their jobs and today's usage rows, then one bulk update (store/bulk.py; and,
where due, one insert of new rows and one of series points). A usage row's `last_at` (the job's
previous report on the host) decides the series point, so job_samples, which grows all
the job's life, is never read here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import and_, bindparam, func, insert, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from ..engine.mig import gpu_share
from ..store.bulk import update_rows
from ..store.models import AllocationRow, GpuHoldRow, JobRow, SampleRow, UsageRow
from .common import LIVE, _ts

SERIES_STEP = 30.0          # seconds between two points of a job's series on one host

_USAGE, _SAMPLES = UsageRow.__table__, SampleRow.__table__
_HOLDS, _JOBS, _ALLOCS = GpuHoldRow.__table__, JobRow.__table__, AllocationRow.__table__
_INTEGRATED = ("sampled_seconds", "util_seconds", "util_peak", "memory_peak_bytes",
               "energy_joules", "zero_seconds", "below_since", "last_at", "last_util",
               "last_power", "last_energy")
_COLUMNS = ("job_id", "team", "attempt", "role", "replica", "host", "gpu", "day",
            *_INTEGRATED)

# Built once (Core, not ORM): a report is a few statements, so building and adapting
# them would cost as much as running them.
_EVERY = _HOLDS.alias("every")
_UKEYS = tuple(c.key for c in _USAGE.c)
# each GPU's today's usage row comes with its hold: the unique key's index finds it
# (the spec's job class only: the idle rule needs no more, and specs can be large)
_HELD = (select(_HOLDS.c.gpu, _JOBS.c.id, _JOBS.c.team, _JOBS.c.attempt,
                _JOBS.c.spec["job_class"].as_string(), _JOBS.c.state, _JOBS.c.idle_since,
                _JOBS.c.idle_flagged_at,
                select(func.count()).where(_EVERY.c.job_id == _JOBS.c.id)
                .scalar_subquery(), *(c.label(f"u_{c.key}") for c in _USAGE.c))
         .join_from(_HOLDS, _JOBS, _JOBS.c.id == _HOLDS.c.job_id)
         .outerjoin(_USAGE, and_(_USAGE.c.job_id == _JOBS.c.id,
                                 _USAGE.c.attempt == _JOBS.c.attempt,
                                 _USAGE.c.host == _HOLDS.c.host, _USAGE.c.gpu == _HOLDS.c.gpu,
                                 _USAGE.c.day == bindparam("day")))
         .where(_HOLDS.c.host == bindparam("host"), _JOBS.c.state.in_(LIVE))
         .order_by(_HOLDS.c.gpu))
_IDS = bindparam("ids", expanding=True)


def _usage_read(newer: bool, spread: bool):
    u = _USAGE.c
    here = u.host == bindparam("host")
    q = select(_USAGE).where(
        u.job_id.in_(_IDS), u.day == bindparam("day") if newer else u.day < bindparam("day"),
        or_(here, u.job_id.in_(bindparam("spread", expanding=True))) if spread else here)
    return q if newer else q.order_by(u.day.desc())


_USAGE_READ = {(newer, spread): _usage_read(newer, spread)
               for newer in (True, False) for spread in (True, False)}
_ROLES = select(_ALLOCS.c.job_id, _ALLOCS.c.role, _ALLOCS.c.replica, _ALLOCS.c.gpus).where(
    _ALLOCS.c.job_id.in_(_IDS), _ALLOCS.c.host == bindparam("host"),
    _ALLOCS.c.live.is_(True))
_INSERT_USAGE, _INSERT_SAMPLES = insert(_USAGE), insert(_SAMPLES)


def day_of(at: datetime) -> str:
    return at.strftime("%Y-%m-%d")


@dataclass(slots=True)
class Usage:
    """A job_usage row in memory: read, integrated, written back in one statement."""

    job_id: str
    team: str
    attempt: int
    role: str
    replica: int
    host: str
    gpu: int
    day: str
    sampled_seconds: float = 0.0
    util_seconds: float = 0.0
    util_peak: float | None = None
    memory_peak_bytes: int | None = None
    energy_joules: float = 0.0
    zero_seconds: float = 0.0
    below_since: datetime | None = None
    last_at: datetime | None = None
    last_util: float | None = None
    last_power: float | None = None
    last_energy: float | None = None
    id: int | None = None


@dataclass(slots=True)
class Held:
    """A live job holding GPUs of the reporting host, with what the idle policy needs."""

    id: str
    team: str
    attempt: int
    job_class: str | None
    state: str
    idle_since: datetime | None
    idle_flagged_at: datetime | None
    held: int                                   # GPUs it holds on every host
    gpus: list[int] = field(default_factory=list)   # those it holds here
    rows: dict[tuple[str, int], Usage] = field(default_factory=dict)  # (host, gpu): newest


@dataclass(slots=True)
class Attributed:
    """What one report was attributed to: the jobs, their idle rules (idle.IdleRule)."""

    jobs: dict[str, Held]
    rules: dict[str, object]
    reported: list[str]          # the jobs whose GPUs the report gave, in its order


def _held(conn: Connection, host: str, today: str) -> dict[str, Held]:
    """The live jobs holding GPUs of `host`, each with its GPUs here, the count of all it
    holds (the idle policy waits for every one of them) and today's usage rows here: one
    statement."""
    jobs: dict[str, Held] = {}
    for r in conn.execute(_HELD, {"host": host, "day": today}):
        job = jobs.get(r[1])
        if job is None:
            job = jobs[r[1]] = Held(*r[1:9])
        job.gpus.append(r[0])
        if r[9] is not None:
            job.rows[(host, r[0])] = Usage(**dict(zip(_UKEYS, r[9:], strict=True)))
    return jobs


def _older(conn: Connection, jobs: dict[str, Held], host: str, wide: set[str],
           today: str) -> None:
    """Into each job's `rows`, the newest usage rows `_held` did not find: for the jobs in
    `wide`, those on the other hosts; older days' for GPUs without a row today (a job's
    first report of the day, or its first at all). No statement in the steady state."""

    def read(ids: list[str], newer: bool) -> None:
        spread = sorted(wide.intersection(ids))
        params = {"ids": ids, "day": today, "host": host}
        if spread:
            params["spread"] = spread
        for r in conn.execute(_USAGE_READ[(newer, bool(spread))], params):
            job = jobs[r.job_id]
            if r.attempt == job.attempt:
                job.rows.setdefault((r.host, r.gpu), Usage(**r._mapping))

    if wide:
        read(sorted(wide), True)
    short = sorted(j.id for j in jobs.values()
                   if any((host, g) not in j.rows for g in j.gpus)
                   or (j.id in wide and len(j.rows) < j.held))
    if short:
        read(short, False)


def _roles(conn: Connection, host: str, rows: list[Usage]) -> None:
    """The role and replica of new usage rows, from the live allocations on `host`."""
    found = {}
    for job_id, role, index, gs in conn.execute(
            _ROLES, {"ids": sorted({r.job_id for r in rows}), "host": host}):
        for g in gs:
            found[(job_id, g)] = (role, index)
    for r in rows:
        r.role, r.replica = found.get((r.job_id, r.gpu), ("?", 0))


def integrate(row: Usage, g: dict, now: datetime, max_gap: float,
              threshold: float) -> None:
    """Add the interval from the row's last sample to this one (`g`, a reported GPU)."""
    util, power = g.get("utilization_gpu"), g.get("power_watts")
    energy, mem = g.get("energy_joules"), g.get("memory_used_bytes")
    if row.last_at is not None:
        dt = _ts(now) - _ts(row.last_at)
        if 0 < dt <= max_gap:
            if util is not None and row.last_util is not None:
                row.sampled_seconds += dt
                row.util_seconds += (util + row.last_util) / 2 * dt
                if util == 0 and row.last_util == 0:
                    row.zero_seconds += dt
            if energy is not None and row.last_energy is not None and energy >= row.last_energy:
                row.energy_joules += energy - row.last_energy
            elif power is not None and row.last_power is not None:
                row.energy_joules += (power + row.last_power) / 2 * dt
    if util is not None:
        row.util_peak = util if row.util_peak is None else max(row.util_peak, util)
        if util < threshold:
            row.below_since = row.below_since or now
        else:
            row.below_since = None
    if mem is not None:
        row.memory_peak_bytes = (mem if row.memory_peak_bytes is None
                                 else max(row.memory_peak_bytes, mem))
    row.last_at, row.last_util, row.last_power, row.last_energy = now, util, power, energy


def record(svc, s: Session, host: str, gpus: list[dict], now: datetime,
           rule_of: Callable[[object, dict], object]) -> Attributed:
    """Attribute a report of `host` to the live jobs holding its GPUs; `rule_of(svc,
    spec)`: a job's idle rule (idle.rule_of, passed in: idle reads what this returns)."""
    today, conn = day_of(now), s.connection()
    jobs = _held(conn, host, today)
    if not jobs:
        return Attributed({}, {}, [])
    rules = {j: rule_of(svc, {"job_class": job.job_class}) for j, job in jobs.items()}
    # a job held elsewhere too is idle only when all its GPUs are: read them all
    wide = {j for j, job in jobs.items()
            if rules[j].after is not None and job.held > len(job.gpus)}
    _older(conn, jobs, host, wide, today)
    prev = {j: max((_ts(r.last_at) for (h, _), r in job.rows.items()
                    if h == host and r.last_at is not None), default=None)
            for j, job in jobs.items()}
    by_gpu = {g: job for job in jobs.values() for g in job.gpus}
    per_job: dict[str, list[dict]] = {}
    fresh: list[Usage] = []
    changed: dict[int, Usage] = {}
    for g in gpus:
        job = by_gpu.get(g["index"])
        if job is None:
            continue
        per_job.setdefault(job.id, []).append(g)
        row = job.rows.get((host, g["index"]))
        if row is None or row.day != today:
            new = Usage(job.id, job.team, job.attempt, "?", 0, host, g["index"], today)
            if row is not None:           # carry the last sample across midnight
                new.last_at, new.last_util = row.last_at, row.last_util
                new.last_power, new.last_energy = row.last_power, row.last_energy
                new.below_since = row.below_since
            job.rows[(host, g["index"])] = row = new
            fresh.append(new)
        elif row.id is not None:
            changed[row.id] = row
        integrate(row, g, now, svc.settings.host_timeout, rules[job.id].threshold)
    if changed:
        update_rows(conn, _USAGE, ("id",), [
            {"id": r.id, **{k: getattr(r, k) for k in _INTEGRATED}} for r in changed.values()])
    if fresh:
        _roles(conn, host, fresh)
        conn.execute(_INSERT_USAGE, [{k: getattr(r, k) for k in _COLUMNS} for r in fresh])
    _series(conn, host, per_job, prev, now)
    return Attributed(jobs, rules, list(per_job))


def _series(conn: Connection, host: str, per_job: dict[str, list[dict]],
            prev: dict[str, float | None], now: datetime) -> None:
    """A point per job whose previous report here was in an earlier SERIES_STEP."""
    step = int(_ts(now) // SERIES_STEP)
    points = []
    for job_id, gs in per_job.items():
        at = prev.get(job_id)
        if at is not None and int(at // SERIES_STEP) == step:
            continue
        utils = [g["utilization_gpu"] for g in gs if g.get("utilization_gpu") is not None]
        mems = [g["memory_used_bytes"] for g in gs if g.get("memory_used_bytes") is not None]
        powers = [g["power_watts"] for g in gs if g.get("power_watts") is not None]
        if not (utils or mems or powers):
            continue
        points.append({"job_id": job_id, "host": host, "at": now, "gpus": len(gs),
                       "utilization_gpu": sum(utils) / len(utils) if utils else None,
                       "memory_used_bytes": sum(mems) if mems else None,
                       "power_watts": sum(powers) if powers else None})
    if points:
        conn.execute(_INSERT_SAMPLES, points)


def charged_gpus(a) -> float:
    """GPUs an allocation row is charged: its whole GPUs, and each MIG device's share of its
    GPU (compute slices / 7, mig.gpu_share), as quotas and fair share charge them."""
    return len(a.gpus) + float(sum(gpu_share(m.get("profile", "")) for m in a.mig or ()))


def mig_devices(a) -> int:
    return len(a.mig or ())


def granted_seconds(allocs, now: datetime, start: datetime | None = None,
                    end: datetime | None = None, per=charged_gpus) -> float:
    """GPU-seconds granted by allocation rows (granted_at .. released_at or now), within
    [start, end) where given; `per=mig_devices`: MIG device-seconds instead."""
    total = 0.0
    for a in allocs:
        n = per(a)
        if a.granted_at is None or not n:
            continue
        lo, hi = _ts(a.granted_at), _ts(a.released_at or now)
        if start is not None:
            lo = max(lo, _ts(start))
        if end is not None:
            hi = min(hi, _ts(end))
        total += max(0.0, hi - lo) * n
    return total
