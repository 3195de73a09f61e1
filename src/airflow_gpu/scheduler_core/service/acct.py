"""Accounting reports (Slurm's sacct, Grid Engine's qacct) from the usage rows and the
allocations' grant times: per job, per team or per day and team, over a window. Any
token reads them, as it reads the queue.

GPU-seconds granted are exact (each allocation's GPUs x the part of its grant inside the
window; a MIG device counts as its share of its GPU, compute slices / 7, and its
device-seconds are reported too); sampled figures (utilization, energy, time at 0 %)
count the UTC days that touch the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select

from ..policy.quota import plain
from ..store.models import AllocationRow, JobRow, SampleRow, UsageRow
from .accounting import (
    SERIES_STEP,
    charged_gpus,
    day_of,
    days_between,
    granted_seconds,
    mig_devices,
)
from .core import NotFound, _ts

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)      # a day short of the end: days still add
MAX_DAYS = 3660          # a report per day spans at most this (ten years)
MAX_POINTS = 500         # a job's series is averaged down to at most this many points
SUMS = ("sampled_seconds", "util_seconds", "energy_joules", "zero_seconds")


def _blank() -> dict:
    return {"gpu_seconds": 0.0, "mig_seconds": 0.0, "sampled_seconds": 0.0,
            "util_seconds": 0.0,
            "util_peak": None, "memory_peak_bytes": None, "energy_joules": 0.0,
            "zero_seconds": 0.0}


def _add(acc: dict, u: UsageRow) -> None:
    for k in SUMS:
        acc[k] += getattr(u, k) or 0.0
    for k, v in (("util_peak", u.util_peak), ("memory_peak_bytes", u.memory_peak_bytes)):
        if v is not None:
            acc[k] = v if acc[k] is None else max(acc[k], v)


def _finish(acc: dict) -> dict:
    """Totals as reported: mean utilization over the sampled GPU-seconds."""
    sampled = acc.pop("sampled_seconds")
    util = acc.pop("util_seconds")
    return {"gpu_seconds": round(acc["gpu_seconds"], 3),
            "gpu_hours": round(acc["gpu_seconds"] / 3600, 4),
            "mig_device_hours": round(acc["mig_seconds"] / 3600, 4),
            "sampled_gpu_seconds": round(sampled, 3),
            "utilization_mean": round(util / sampled, 3) if sampled else None,
            "utilization_peak": acc["util_peak"],
            "memory_peak_bytes": acc["memory_peak_bytes"],
            "energy_joules": round(acc["energy_joules"], 3),
            "zero_utilization_seconds": round(acc["zero_seconds"], 3)}


def window(since: datetime | None, until: datetime | None, now: datetime,
           by: str = "job") -> tuple[datetime, datetime]:
    for name, at in (("since", since), ("until", until)):
        if at is not None and not EARLIEST <= at <= LATEST:
            raise ValueError(f"{name}: {at.isoformat()} is out of range; give a time "
                             "between 1970 and 9999")
    until = until or now
    since = since or max(EARLIEST, until - timedelta(days=7))
    if since >= until:
        raise ValueError(f"since: {since.isoformat()} is not before until "
                         f"{until.isoformat()}; give an earlier --since")
    if by == "day" and until - since > timedelta(days=MAX_DAYS):
        raise ValueError(f"since: a report per day covers at most {MAX_DAYS} days, "
                         f"{since.date()} to {until.date()} is more; give a later --since "
                         "or report --by team")
    return since, until


def report(svc, by: str, since: datetime | None, until: datetime | None,
           team: str | None, job: str | None, now: datetime) -> dict:
    since, until = window(since, until, now, by)
    with svc.reads() as s:
        q = (select(AllocationRow, JobRow.team, JobRow.name).join(
            JobRow, JobRow.id == AllocationRow.job_id).where(
            AllocationRow.granted_at < until,
            or_(AllocationRow.released_at.is_(None), AllocationRow.released_at >= since)))
        u = select(UsageRow).where(UsageRow.day >= day_of(since), UsageRow.day <= day_of(until))
        if team:
            q, u = q.where(JobRow.team == team), u.where(UsageRow.team == team)
        if job:
            q, u = q.where(JobRow.id == job), u.where(UsageRow.job_id == job)
        allocs = s.execute(q).all()
        usage = list(s.scalars(u))
        ids = {a.job_id for a, _, _ in allocs} | {r.job_id for r in usage}
        jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
    rows = {"job": _by_job, "team": _by_team, "day": _by_day}[by](
        allocs, usage, jobs, since, until, now)
    return {"by": by, "since": since, "until": until, "rows": rows}


def _grant(acc: dict, a, now, since=None, until=None) -> None:
    """Add an allocation's GPU-seconds (MIG devices by share) and MIG device-seconds."""
    acc["gpu_seconds"] += granted_seconds([a], now, since, until)
    acc["mig_seconds"] += granted_seconds([a], now, since, until, per=mig_devices)


def _by_job(allocs, usage, jobs, since, until, now) -> list[dict]:
    acc: dict[str, dict] = {}
    grants: dict[tuple, list] = {}        # (job, admission's grant time) -> [GPUs, MIG]
    first: dict[str, datetime] = {}
    for a, _, _ in allocs:
        d = acc.setdefault(a.job_id, _blank())
        _grant(d, a, now, since, until)
        got = grants.setdefault((a.job_id, a.granted_at), [0.0, 0])
        got[0] += charged_gpus(a)
        got[1] += mig_devices(a)
        if a.granted_at and (a.job_id not in first or a.granted_at < first[a.job_id]):
            first[a.job_id] = a.granted_at
    for r in usage:
        _add(acc.setdefault(r.job_id, _blank()), r)
    gpus: dict[str, list] = {}
    for (job_id, _), (n, m) in grants.items():
        had = gpus.get(job_id, [0.0, 0])
        gpus[job_id] = [max(had[0], n), max(had[1], m)]
    out = []
    for job_id, d in acc.items():
        j = jobs.get(job_id)
        if j is None:
            continue
        end = j.finished_at
        start = first.get(job_id)
        out.append({"job": job_id, "name": j.name, "team": j.team, "state": j.state,
                    "exit_code": j.exit_code, "attempts": j.attempt or 0,
                    "gpus": plain(gpus.get(job_id, [0])[0]),
                    "mig_devices": gpus.get(job_id, [0, 0])[1],
                    "submitted_at": j.submitted_at, "started_at": start, "finished_at": end,
                    "elapsed_seconds": round(_ts(end or now) - _ts(start), 3) if start
                    else None, "idle_flagged": j.idle_flagged_at is not None, **_finish(d)})
    out.sort(key=lambda r: (_ts(r["started_at"] or r["submitted_at"]), r["job"]))
    return out


def _by_team(allocs, usage, jobs, since, until, now) -> list[dict]:
    acc: dict[str, dict] = {}
    count: dict[str, set] = {}
    for a, team, _ in allocs:
        _grant(acc.setdefault(team, _blank()), a, now, since, until)
        count.setdefault(team, set()).add(a.job_id)
    for r in usage:
        _add(acc.setdefault(r.team, _blank()), r)
        count.setdefault(r.team, set()).add(r.job_id)
    return [{"team": t, "jobs": len(count.get(t, ())), **_finish(d)}
            for t, d in sorted(acc.items())]


def _by_day(allocs, usage, jobs, since, until, now) -> list[dict]:
    acc: dict[tuple[str, str], dict] = {}
    count: dict[tuple[str, str], set] = {}
    for midnight in days_between(since, until):
        lo, hi = max(since, midnight), min(until, midnight + timedelta(days=1))
        for a, team, _ in allocs:
            if granted_seconds([a], now, lo, hi):
                key = (day_of(midnight), team)
                _grant(acc.setdefault(key, _blank()), a, now, lo, hi)
                count.setdefault(key, set()).add(a.job_id)
    for r in usage:
        key = (r.day, r.team)
        _add(acc.setdefault(key, _blank()), r)
        count.setdefault(key, set()).add(r.job_id)
    return [{"day": d, "team": t, "jobs": len(count.get((d, t), ())), **_finish(v)}
            for (d, t), v in sorted(acc.items())]


def job_usage(svc, job_id: str, now: datetime) -> dict:
    """One job: its totals, each replica's, and its utilization over time."""
    with svc.reads() as s:
        j = s.get(JobRow, job_id)
        if j is None:
            raise NotFound(f"job {job_id!r} not found")
        allocs = list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)
                                .order_by(AllocationRow.id)))
        usage = list(s.scalars(select(UsageRow).where(UsageRow.job_id == job_id)))
        samples = list(s.scalars(select(SampleRow).where(SampleRow.job_id == job_id)
                                 .order_by(SampleRow.at)))
    total = _blank()
    replicas: dict[tuple, dict] = {}
    gpus: dict[tuple, set] = {}
    mig: dict[tuple, dict] = {}
    for a in allocs:
        key = (a.role, a.replica, a.host)
        _grant(total, a, now)
        _grant(replicas.setdefault(key, _blank()), a, now)
        gpus.setdefault(key, set()).update(a.gpus)
        for m in a.mig or ():
            mig.setdefault(key, {})[(m["gpu"], m["index"])] = m.get("label")
    for r in usage:
        _add(total, r)
        key = (r.role, r.replica, r.host)
        _add(replicas.setdefault(key, _blank()), r)
        gpus.setdefault(key, set()).add(r.gpu)
    return {"job": job_id, "name": j.name, "team": j.team, "state": j.state,
            "idle_since": j.idle_since, "idle_flagged_at": j.idle_flagged_at,
            **_finish(total),
            "replicas": [{"role": k[0], "index": k[1], "host": k[2],
                          "gpus": sorted(gpus[k]),
                          "mig": [x for _, x in sorted(mig.get(k, {}).items())],
                          **_finish(v)}
                         for k, v in sorted(replicas.items())],
            "series": series(samples)}


def series(samples: list[SampleRow]) -> list[dict]:
    """The job's points across hosts: per SERIES_STEP, utilization averaged over its GPUs,
    memory and power summed; averaged down to MAX_POINTS."""
    buckets: dict[int, list[SampleRow]] = {}
    for p in samples:
        buckets.setdefault(int(_ts(p.at) // SERIES_STEP), []).append(p)
    keys = sorted(buckets)
    group = max(1, -(-len(keys) // MAX_POINTS))
    out = []
    for i in range(0, len(keys), group):
        pts = [p for k in keys[i:i + group] for p in buckets[k]]
        per = len(keys[i:i + group])
        util = [(p.utilization_gpu, p.gpus) for p in pts if p.utilization_gpu is not None]
        weight = sum(n for _, n in util)
        mems = [p.memory_used_bytes for p in pts if p.memory_used_bytes is not None]
        power = [p.power_watts for p in pts if p.power_watts is not None]
        out.append({"at": pts[0].at,
                    "utilization_gpu": round(sum(u * n for u, n in util) / weight, 2)
                    if weight else None,
                    "memory_used_bytes": round(sum(mems) / per) if mems else None,
                    "power_watts": round(sum(power) / per, 2) if power else None})
    return out
