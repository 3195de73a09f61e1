"""Errors a scheduling pass gets past. One job's or one team's bad data (a spec an older
version stored, a job class no longer installed, a team setting out of bounds) must not
stop the pass for everyone: it is logged, surfaced where its owner looks (the job's
pending reason `Error` and an event; the team's jobs' events; the
`airflow_gpu_pass_errors_total` metric by kind), and the rest is scheduled."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..engine.cluster import Cluster
from ..engine.state import ClusterState
from ..store.models import EventRow, JobRow
from .common import LIVE, PENDING, _update, utcnow
from .health import describe, expected
from .uow import Store

log = logging.getLogger(__name__)
ERROR = "Error"        # the pending reason code of a job the pass could not take in


def pending_job(svc: Store, s: Session, row: JobRow, exc: Exception) -> None:
    """A pending job the pass could not take in: it waits with reason `Error` (and one
    event per distinct error) while the others are scheduled (the metric counts it in
    every pass: warm.py)."""
    message = (f"the scheduler cannot consider this job: {describe(exc)}; it stays pending "
               "and is tried again each pass (cancel it and submit it again if its spec "
               "is at fault)")
    if (row.reason_code, row.reason) == (ERROR, message):
        return                        # already told; no write (a pass must stay cheap)
    log.error("job %s: %s", row.id, message, exc_info=None if expected(exc) else exc)
    s.execute(_update(JobRow).where(JobRow.id == row.id, JobRow.state == PENDING).values(
        reason_code=ERROR, reason=message, details={"error": type(exc).__name__},
        eta_at=None))
    svc._event(s, "error", message, job=row.id)


def live_job(svc: Store, s: Session, state: ClusterState, cluster: Cluster, row: JobRow,
             held: list, exc: Exception) -> None:
    """A running job the pass cannot rebuild: its hosts get no new work in this pass (what
    it holds is not known to the engine), once told in an event."""
    message = (f"the scheduler cannot rebuild this running job: {describe(exc)}; its hosts "
               f"({', '.join(sorted({a.host for a in held})) or 'none'}) get no new work "
               "until it ends")
    for name in {a.host for a in held}:
        if name in cluster.by_name:
            state.set_drained(name)
    if svc.told.get(("job", row.id)) != message:
        svc.told[("job", row.id)] = message
        log.error("job %s: %s", row.id, message, exc_info=None if expected(exc) else exc)
        svc._event(s, "error", message, job=row.id)


def finish(svc: Store, s: Session, errors: dict[str, str]) -> None:
    """After the pass: teams whose setting or fair-share factor failed are logged, with an
    event (and one on each of their pending jobs) when the error is new."""
    svc.pass_errors.extend("team" for _ in errors)
    for team, message in errors.items():
        if svc.told.get(("team", team)) == message:
            continue
        svc.told[("team", team)] = message
        log.error("%s", message)
        now = utcnow()
        s.add(EventRow(at=now, kind="error", message=message))
        s.add_all(EventRow(at=now, job_id=job_id, kind="error", message=message)
                  for job_id in s.scalars(select(JobRow.id).where(
                      JobRow.team == team, JobRow.state == PENDING)))
    for key in [k for k in svc.told if k[0] == "team" and k[1] not in errors]:
        del svc.told[key]       # fixed: told again should it come back
    jobs = [k[1] for k in svc.told if k[0] == "job"]
    if jobs:                    # forget jobs that have ended
        live = set(s.scalars(select(JobRow.id).where(JobRow.id.in_(jobs),
                                                     JobRow.state.in_(LIVE))))
        for job_id in set(jobs) - live:
            del svc.told[("job", job_id)]
