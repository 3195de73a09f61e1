"""`acct --by reservation`: what each admin's reservation held and what its jobs used of
it over a window (Slurm's `sreport reservation utilization`): its hosts' GPU-hours inside
the window (up to now), the GPU-hours its jobs were granted there, and the rest, unused.
A maintenance reservation's GPU-hours are what it cost the cluster. A reservation deleted
after its start is reported to its deletion (state `deleted`), as its jobs keep its name."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from ..store.models import AllocationRow, DeletedReservationRow, JobRow, ReservationRow
from .accounting import granted_seconds
from .acct import window
from .common import _ts
from .reservations import _utc, state_of
from .uow import Store


def report(svc: Store, since: datetime | None, until: datetime | None,
           team: str | None, now: datetime) -> dict:
    since, until = window(since, until, now)
    svc.refresh_cluster()
    gpus_of = {h.name: h.type.n_gpus for h in svc.cluster.hosts}
    rows = []
    with svc.reads() as s:
        found = [r for table in (ReservationRow, DeletedReservationRow)
                 for r in s.scalars(select(table).where(table.start_at < until,
                                                        table.end_at > since))]
        for r in sorted(found, key=lambda r: (_ts(r.start_at), r.name)):
            if team and team not in (r.teams or ()):
                continue
            state = ("deleted" if isinstance(r, DeletedReservationRow)
                     else state_of(r, now))
            lo = max(_ts(r.start_at), _ts(since))
            hi = min(_ts(r.end_at), _ts(until), _ts(now))
            held = sum(gpus_of.get(h, 0) for h in r.hosts) * max(0.0, hi - lo)
            # its jobs, on its hosts (a name given again after a delete names the jobs
            # of both)
            allocs = list(s.scalars(select(AllocationRow).join(
                JobRow, JobRow.id == AllocationRow.job_id).where(
                JobRow.reservation == r.name, AllocationRow.host.in_(list(r.hosts)),
                AllocationRow.granted_at < r.end_at)))
            used = (granted_seconds(allocs, now, datetime.fromtimestamp(lo, since.tzinfo),
                                    datetime.fromtimestamp(hi, since.tzinfo))
                    if hi > lo else 0.0)
            rows.append({"reservation": r.name, "state": state,
                         "maint": bool(r.maint), "teams": list(r.teams or ()),
                         "hosts": list(r.hosts), "start": _utc(r.start_at),
                         "end": _utc(r.end_at),
                         "gpus": sum(gpus_of.get(h, 0) for h in r.hosts),
                         "jobs": len({a.job_id for a in allocs}),
                         "reserved_gpu_hours": round(held / 3600, 4),
                         "used_gpu_hours": round(used / 3600, 4),
                         "unused_gpu_hours": round(max(0.0, held - used) / 3600, 4),
                         "used_fraction": round(used / held, 4) if held else None})
    return {"by": "reservation", "since": since.isoformat(), "until": until.isoformat(),
            "rows": rows}
