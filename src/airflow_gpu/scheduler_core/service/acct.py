"""Accounting reports (Slurm's sacct, Grid Engine's qacct) from the usage rows and the
allocations' grant times: per job, per team or per day and team, over a window. Any
token reads them, as it reads the queue.

GPU-seconds granted are exact (each allocation's GPUs x the part of its grant inside the
window; a MIG device counts as its share of its GPU, compute slices / 7, and its
device-seconds are reported too); sampled figures (utilization, energy, time at 0 %)
count the UTC days that touch the window."""

from __future__ import annotations

import bisect
import math
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import func, or_, select, union

from ..policy.quota import plain
from ..store.models import AllocationRow, JobRow, SampleRow, UsageRow
from . import readlimit
from .accounting import (
    SERIES_STEP,
    charged_gpus,
    day_of,
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


# what a 503 for a report stopped by the read limit asks for instead
NARROW = {"job": "give a later since (or an earlier until), a team or a job",
          "team": "give a later since (or an earlier until) or a team",
          "user": "give a later since (or an earlier until) or a team",
          "day": "give a later since (or an earlier until), a team, or report by team"}


def report(svc, by: str, since: datetime | None, until: datetime | None,
           team: str | None, job: str | None, now: datetime) -> dict:
    """The report over the window: allocations clipped to it, usage summed by the
    database per job, team or day and team (each day's grants from each allocation's
    first and last day, its full days in between added per team at once)."""
    since, until = window(since, until, now, by)
    with readlimit.bounded(svc, f"since: {NARROW[by]}") as limit:
        s = limit.session
        q = (select(AllocationRow.job_id, JobRow.team, JobRow.user, AllocationRow.granted_at,
                    AllocationRow.released_at, AllocationRow.gpus, AllocationRow.mig)
             .join(JobRow, JobRow.id == AllocationRow.job_id).where(
            AllocationRow.granted_at < until,
            or_(AllocationRow.released_at.is_(None), AllocationRow.released_at >= since)))
        where = [UsageRow.day >= day_of(since), UsageRow.day <= day_of(until)]
        if team:
            q, where = q.where(JobRow.team == team), [*where, UsageRow.team == team]
        if job:
            q, where = q.where(JobRow.id == job), [*where, UsageRow.job_id == job]
        keys = {"job": (UsageRow.job_id,), "team": (UsageRow.team,),
                "user": (UsageRow.team, JobRow.user),
                "day": (UsageRow.day, UsageRow.team)}[by]
        allocs = s.execute(q).all()
        limit.check()
        usage_q = select(*keys, *_SUMMED)
        if by == "user":          # a usage row's user is its job's
            usage_q = usage_q.join(JobRow, JobRow.id == UsageRow.job_id)
        usage = s.execute(usage_q.where(*where).group_by(*keys)).all()
        limit.check()
        who = []              # (team or (day, team)), job): the jobs each row counts
        if by != "job":
            who_q = select(*keys, UsageRow.job_id)
            if by == "user":
                who_q = who_q.join(JobRow, JobRow.id == UsageRow.job_id)
            who = s.execute(who_q.where(*where).distinct()).all()
        jobs = {}
        if by == "job":
            ids = union(q.with_only_columns(AllocationRow.job_id),
                        select(UsageRow.job_id).where(*where))
            jobs = {j.id: j for j in s.execute(select(*_JOB_COLUMNS).where(
                JobRow.id.in_(ids)))}
        limit.check()
        if by == "job":
            rows = _by_job(allocs, usage, jobs, since, until, now)
        elif by == "team":
            rows = _by_team(allocs, usage, who, since, until, now)
        elif by == "user":
            rows = _by_user(allocs, usage, who, since, until, now)
        else:
            rows = _by_day(allocs, usage, who, since, until, now)
        limit.check()
    return {"by": by, "since": since, "until": until, "rows": rows}


# what a line per job shows of the job (not its spec: decoding it would cost the most)
_JOB_COLUMNS = (JobRow.id, JobRow.name, JobRow.team, JobRow.state, JobRow.exit_code,
                JobRow.attempt, JobRow.submitted_at, JobRow.finished_at,
                JobRow.idle_flagged_at)
# usage summed per group, named as UsageRow's columns (_add reads them)
_SUMMED = (*(func.sum(getattr(UsageRow, k)).label(k) for k in SUMS),
           func.max(UsageRow.util_peak).label("util_peak"),
           func.max(UsageRow.memory_peak_bytes).label("memory_peak_bytes"))


def _grant(acc: dict, a, now, since=None, until=None) -> None:
    """Add an allocation's GPU-seconds (MIG devices by share) and MIG device-seconds."""
    acc["gpu_seconds"] += granted_seconds([a], now, since, until)
    acc["mig_seconds"] += granted_seconds([a], now, since, until, per=mig_devices)


def _by_job(allocs, usage, jobs, since, until, now) -> list[dict]:
    acc: dict[str, dict] = {}
    grants: dict[tuple, list] = {}        # (job, admission's grant time) -> [GPUs, MIG]
    first: dict[str, datetime] = {}
    for a in allocs:
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


def _by_team(allocs, usage, who, since, until, now) -> list[dict]:
    acc: dict[str, dict] = {}
    count: dict[str, set] = {}
    for a in allocs:
        _grant(acc.setdefault(a.team, _blank()), a, now, since, until)
        count.setdefault(a.team, set()).add(a.job_id)
    for r in usage:
        _add(acc.setdefault(r.team, _blank()), r)
    for team, job_id in who:
        count.setdefault(team, set()).add(job_id)
    return [{"team": t, "jobs": len(count.get(t, ())), **_finish(d)}
            for t, d in sorted(acc.items())]


def _by_user(allocs, usage, who, since, until, now) -> list[dict]:
    """Per team and user (null: the team's jobs that name none); they add up to the
    team's line."""
    acc: dict[tuple, dict] = {}
    count: dict[tuple, set] = {}
    for a in allocs:
        _grant(acc.setdefault((a.team, a.user), _blank()), a, now, since, until)
        count.setdefault((a.team, a.user), set()).add(a.job_id)
    for r in usage:
        _add(acc.setdefault((r.team, r.user), _blank()), r)
    for team, user, job_id in who:
        count.setdefault((team, user), set()).add(job_id)
    return [{"team": t, "user": u, "jobs": len(count.get((t, u), ())), **_finish(d)}
            for (t, u), d in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]


DAY = 86400.0


def _changes(n_days: int) -> list[list]:
    return [[0.0, 0.0, 0] for _ in range(n_days + 1)]


def _by_day(allocs, usage, who, since, until, now) -> list[dict]:
    """Per UTC day and team. An allocation adds its first and last day's part; the days
    in between, whole, go to a running sum per team (a difference array): the work is one
    step per allocation and per day and team, not per allocation and day."""
    first_day = since.replace(hour=0, minute=0, second=0, microsecond=0)
    t0, lo_w, hi_w, now_s = _ts(first_day), _ts(since), _ts(until), _ts(now)
    n_days = (until.date() - first_day.date()).days + 1
    part: dict[tuple[int, str], list] = {}       # (day, team) -> [GPU-s, MIG-s]
    whole: dict[str, list] = {}      # team -> per day: change of [GPUs, MIG, jobs]
    spans: dict[tuple[str, str], list] = {}      # (team, job) -> [(first, last day)]
    for a in allocs:
        n, m = charged_gpus(a), mig_devices(a)
        if a.granted_at is None or not n:
            continue
        lo = max(_ts(a.granted_at), lo_w)
        hi = min(_ts(a.released_at) if a.released_at else now_s, hi_w)
        if hi <= lo:
            continue
        k1 = int((lo - t0) // DAY)
        k2 = max(k1, math.ceil((hi - t0) / DAY) - 1)
        spans.setdefault((a.team, a.job_id), []).append((k1, k2))
        for k, sec in ((k1, min(hi, t0 + (k1 + 1) * DAY) - lo),
                       (k2, hi - max(lo, t0 + k2 * DAY)) if k2 > k1 else (k1, 0.0)):
            if sec > 0:
                got = part.setdefault((k, a.team), [0.0, 0.0])
                got[0] += sec * n
                got[1] += sec * m
        d = whole.get(a.team) or whole.setdefault(a.team, _changes(n_days))
        if k2 > k1 + 1:
            d[k1 + 1][0] += n
            d[k1 + 1][1] += m
            d[k2][0] -= n
            d[k2][1] -= m
    merged: dict[tuple[str, str], list] = {}
    for key, ranges in spans.items():         # a job's grants, as runs of days
        ranges.sort()
        runs = [list(ranges[0])]
        for k1, k2 in ranges[1:]:
            if k1 <= runs[-1][1] + 1:
                runs[-1][1] = max(runs[-1][1], k2)
            else:
                runs.append([k1, k2])
        merged[key] = runs
        d = whole.get(key[0]) or whole.setdefault(key[0], _changes(n_days))
        for k1, k2 in runs:
            d[k1][2] += 1
            d[k2 + 1][2] -= 1
    acc: dict[tuple[int, str], dict] = {}
    jobs: dict[tuple[int, str], int] = {}
    for team, d in whole.items():
        gpus = mig = 0.0
        running = 0
        for k in range(n_days):
            gpus, mig, running = gpus + d[k][0], mig + d[k][1], running + d[k][2]
            if running:                  # a day some grant of the team overlaps
                v = acc[(k, team)] = _blank()
                v["gpu_seconds"], v["mig_seconds"] = gpus * DAY, mig * DAY
                jobs[(k, team)] = running
    for key, (g, mg) in part.items():
        acc[key]["gpu_seconds"] += g
        acc[key]["mig_seconds"] += mg
    start = first_day.date()
    for r in usage:
        _add(acc.setdefault(((date.fromisoformat(r.day) - start).days, r.team), _blank()), r)
    for day, team, job_id in who:          # a job with usage but no grant that day
        k = (date.fromisoformat(day) - start).days
        ranges = merged.get((team, job_id), ())
        i = bisect.bisect_right(ranges, [k, math.inf]) - 1
        if i < 0 or ranges[i][1] < k:
            jobs[(k, team)] = jobs.get((k, team), 0) + 1
    return [{"day": day_of(first_day + timedelta(days=k)), "team": t,
             "jobs": jobs.get((k, t), 0), **_finish(v)} for (k, t), v in sorted(acc.items())]


def job_usage(svc, job_id: str, now: datetime) -> dict:
    """One job: its totals, each replica's, and its utilization over time."""
    with readlimit.bounded(svc, f"job: read its totals alone with GET /api/v1/accounting"
                           f"?job={job_id}") as limit:
        s = limit.session
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
