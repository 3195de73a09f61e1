"""Per-job GPU accounting: each node agent report is attributed, GPU by GPU, to the job
holding the GPU (the service knows the holds), and integrated into the job's usage rows:
sampled seconds, utilization x seconds (trapezoids between consecutive samples), peak
utilization and memory, energy (the GPU's energy counter where it reports one, else the
power integrated) and the time at zero utilization. Gaps longer than the host timeout
(the host was unreachable) are not integrated. The job's series for the UI gets one point
per SERIES_STEP and host."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..engine.mig import gpu_share
from ..store.models import AllocationRow, GpuHoldRow, JobRow, SampleRow, UsageRow
from .common import LIVE, _ts

SERIES_STEP = 30.0          # seconds between two points of a job's series on one host


def day_of(at: datetime) -> str:
    return at.strftime("%Y-%m-%d")


def _latest(s: Session, job_ids: list[str], host: str) -> dict[tuple, UsageRow]:
    """The newest usage row of each (job, attempt, gpu) on `host`: it carries the last
    sample (an older day's row starts the next day's)."""
    out: dict[tuple, UsageRow] = {}
    rows = s.scalars(select(UsageRow).where(UsageRow.job_id.in_(job_ids),
                                            UsageRow.host == host)
                     .order_by(UsageRow.day.desc()))
    for r in rows:
        out.setdefault((r.job_id, r.attempt, r.gpu), r)
    return out


def integrate(row: UsageRow, g: dict, now: datetime, max_gap: float,
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


def record(svc, s: Session, host: str, gpus: list[dict], now: datetime) -> list[str]:
    """Attribute a report of `host` to the live jobs holding its GPUs; returns their ids."""
    from .idle import threshold_of

    held = {g: (job_id, team, attempt, spec) for g, job_id, team, attempt, spec in s.execute(
        select(GpuHoldRow.gpu, JobRow.id, JobRow.team, JobRow.attempt, JobRow.spec)
        .join(JobRow, JobRow.id == GpuHoldRow.job_id)
        .where(GpuHoldRow.host == host, JobRow.state.in_(LIVE)))}
    if not held:
        return []
    ids = sorted({j for j, *_ in held.values()})
    replica = {}
    for job_id, role, index, gs in s.execute(
            select(AllocationRow.job_id, AllocationRow.role, AllocationRow.replica,
                   AllocationRow.gpus).where(AllocationRow.job_id.in_(ids),
                                             AllocationRow.host == host,
                                             AllocationRow.live.is_(True))):
        for g in gs:
            replica[(job_id, g)] = (role, index)
    latest = _latest(s, ids, host)
    today = day_of(now)
    per_job: dict[str, list[dict]] = {}
    for g in gpus:
        hit = held.get(g["index"])
        if hit is None:
            continue
        job_id, team, attempt, spec = hit
        per_job.setdefault(job_id, []).append(g)
        role, index = replica.get((job_id, g["index"]), ("?", 0))
        row = latest.get((job_id, attempt, g["index"]))
        if row is None or row.day != today:
            new = UsageRow(job_id=job_id, team=team, attempt=attempt, role=role,
                           replica=index, host=host, gpu=g["index"], day=today,
                           sampled_seconds=0.0, util_seconds=0.0, energy_joules=0.0,
                           zero_seconds=0.0)
            if row is not None:           # carry the last sample across midnight
                new.last_at, new.last_util = row.last_at, row.last_util
                new.last_power, new.last_energy = row.last_power, row.last_energy
                new.below_since = row.below_since
            s.add(new)
            row = new
        integrate(row, g, now, svc.settings.host_timeout, threshold_of(svc, spec))
    _series(s, host, per_job, now)
    s.flush()
    return list(per_job)


def _series(s: Session, host: str, per_job: dict[str, list[dict]], now: datetime) -> None:
    last = dict(s.execute(select(SampleRow.job_id, func.max(SampleRow.at)).where(
        SampleRow.job_id.in_(list(per_job)), SampleRow.host == host)
        .group_by(SampleRow.job_id)).all())
    for job_id, gs in per_job.items():
        at = last.get(job_id)
        if at is not None and _ts(now) - _ts(at) < SERIES_STEP:
            continue
        utils = [g["utilization_gpu"] for g in gs if g.get("utilization_gpu") is not None]
        mems = [g["memory_used_bytes"] for g in gs if g.get("memory_used_bytes") is not None]
        powers = [g["power_watts"] for g in gs if g.get("power_watts") is not None]
        if not (utils or mems or powers):
            continue
        s.add(SampleRow(job_id=job_id, host=host, at=now, gpus=len(gs),
                        utilization_gpu=sum(utils) / len(utils) if utils else None,
                        memory_used_bytes=sum(mems) if mems else None,
                        power_watts=sum(powers) if powers else None))


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
