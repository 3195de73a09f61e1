"""A pass's admissions, written in bulk: the jobs still pending and not held are locked,
then updated by one statement, and their allocations and holds inserted a table at a
time, so a pass that admits a thousand jobs writes a handful of statements, not a few
per job (a long write holds the pass's transaction, and the launchers wait on it)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ..policy.windows import window_of
from ..store.bulk import update_rows
from ..store.models import AllocationRow, CpuHoldRow, GpuHoldRow, JobRow, MigHoldRow
from ..units import format_duration
from . import reserving
from .common import CHUNK, PENDING, _ts, not_held

_JOBS = JobRow.__table__


def admit(svc, s: Session, result, stamp: datetime, t_now: float) -> list[str]:
    """Write `result.started` as admitted at `stamp`; returns the jobs admitted (those
    cancelled or held since the pass read them are left as they are)."""
    ids = [job.name for job, _ in result.started]
    attempts: dict[str, int] = {}
    for i in range(0, len(ids), CHUNK):       # locked: nothing changes them until commit
        attempts.update(s.execute(select(JobRow.id, JobRow.attempt).where(
            JobRow.id.in_(ids[i:i + CHUNK]), JobRow.state == PENDING, not_held())
            .with_for_update()).all())
    lease = stamp + timedelta(seconds=svc.settings.lease_ttl)
    rows, allocs, holds = [], [], {GpuHoldRow: [], MigHoldRow: [], CpuHoldRow: []}
    admitted = []
    for job, placed in result.started:
        if job.name not in attempts:
            continue                  # cancelled or held meanwhile
        # its own limit stops it (deadline_at); a cut only makes it yield (overrun.py)
        cut_at, cut_by = result.cut.get(job.name, (None, None))
        window = window_of(cut_by) if cut_by else None
        deadline = min(_ts(stamp) + job.limit, result.until.get(job.name, math.inf))
        rows.append({
            "id": job.name, "attempt": attempts[job.name] + 1,
            "deadline_at": None if deadline == math.inf else
            datetime.fromtimestamp(deadline, UTC),
            "yield_at": None if cut_at is None else datetime.fromtimestamp(cut_at, UTC),
            "stop_grace": round(job.grace), "limit_cut_by": None if window else cut_by,
            "yield_reservation": window, "borrowed": job.borrowed})
        for a in placed.allocations:
            d = a.to_dict()
            allocs.append({"job_id": job.name, "role": a.role, "replica": a.index,
                           "host": a.host.name, "gpus": d["gpus"], "cpus": d["cpus"],
                           "memory_by_numa": d["memory_by_numa"], "nics": d["nics"],
                           "mig": d.get("mig"), "live": True, "granted_at": stamp})
            h = a.host.name
            holds[GpuHoldRow] += [{"host": h, "gpu": g, "job_id": job.name} for g in a.gpus]
            holds[MigHoldRow] += [{"host": h, "gpu": m.gpu, "device": m.index,
                                   "job_id": job.name} for m in a.slices]
            holds[CpuHoldRow] += [{"host": h, "cpu": c, "job_id": job.name} for c in a.cpus]
        hosts = ", ".join(dict.fromkeys(a.host.name for a in placed.allocations))
        svc._event(s, "admitted", f"admitted on {hosts or 'no GPU host'}"
                   + limit_note(job.limit, (cut_at or t_now) - t_now, cut_by,
                                result.until.get(job.name))
                   + ("; on borrowed quota (it may be reclaimed)" if job.borrowed
                      else ""), job=job.name)
        admitted.append(job.name)
    if not rows:
        return admitted
    conn = s.connection()
    update_rows(conn, _JOBS, ("id",), rows, {
        "state": "admitted", "admitted_at": stamp, "lease_expires_at": lease,
        "reason_code": None, "reason": None, "details": {}, "eta_at": None,
        "promised_at": None})
    if allocs:
        conn.execute(insert(AllocationRow.__table__), allocs)
    for table, values in holds.items():   # the hold keys are checked here, in the pass's
        if values:                        # transaction: a clash raises IntegrityError
            conn.execute(insert(table.__table__), values)
    return admitted


def limit_note(limit: float, left: float, cut_by: str | None,
               until: float | None = None) -> str:
    """What the admission event says of the job's time limit and its yield."""
    own = f"; time limit {format_duration(limit)}" if limit < math.inf else ""
    if until is not None:
        own += (f"; stopped at its reservation's end, "
                f"{datetime.fromtimestamp(until, UTC).isoformat()}")
    if cut_by and window_of(cut_by):
        return own + reserving.yield_note(window_of(cut_by), left)
    if cut_by:
        return (f"{own}; it backfills ahead of the reservation for job {cut_by[:8]}: if it "
                f"runs past its expected runtime into it (in {format_duration(max(0, left))})"
                ", it is stopped and requeued under the same id")
    return own
