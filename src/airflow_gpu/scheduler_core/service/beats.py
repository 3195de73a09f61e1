"""Heartbeats of many jobs in one request: a launcher that runs many jobs (a host's
supervisor, a site's own launcher) extends all their leases in one short transaction
instead of one request each. A single heartbeat is mostly its HTTP request; one server
process answers a few hundred a second, and 8,192 running jobs beating every 20 s send
410. Each job is answered as its own heartbeat would be: its lease extended (or its start
confirmed, with its event), or refused with the status and words a single heartbeat
gets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import or_, select

from ..store.models import JobRow
from . import jobs, rights
from .common import CHUNK, QUIET, Principal, _stale, _update, utcnow
from .errors import Conflict, Forbidden, NotFound

MAX_BEATS = 1000        # jobs one request beats (a request's transaction stays short)
BEATING = ("running", "preempting")
# what the answer tells a launcher of each job (api/models/batch.py BeatOut): columns, not
# whole rows, so the spec and the reasons are not read and parsed for every beat
ANSWER = (JobRow.id, JobRow.state, JobRow.attempt, JobRow.lease_expires_at,
          JobRow.stop_grace, JobRow.yield_at, JobRow.yield_reservation, JobRow.idle_since,
          JobRow.idle_flagged_at, JobRow.preempted_by, JobRow.preempt_reason,
          JobRow.preempt_signal, JobRow.preempt_grace, JobRow.preempt_deadline_at)


@dataclass
class Refused:
    id: str
    error: NotFound | Forbidden | Conflict     # what a single heartbeat of it raises


def heartbeats(svc, items: list[tuple[str, int | None]], who: Principal
               ) -> tuple[list, list[Refused]]:
    """Extend the leases of `items` (job id, the admission its launcher started or None)
    and confirm the starts of those admitted; returns the jobs beaten, as they now are
    (the ANSWER columns), and those refused. One transaction, a few statements per CHUNK
    of jobs."""
    wanted = dict(items)                        # a job named twice is beaten once
    refused: list[Refused] = []
    beaten: list = []
    with svc.sessions.begin() as s:
        s.connection()        # begun (SQLite: the write lock held) before the clock is read
        now = utcnow()
        lease = now + timedelta(seconds=svc.settings.lease_ttl)
        ids = list(wanted)
        seen = {}
        for k in range(0, len(ids), CHUNK):
            seen.update((r.id, r) for r in s.execute(select(
                JobRow.id, JobRow.team, JobRow.user, JobRow.name, JobRow.state,
                JobRow.attempt).where(JobRow.id.in_(ids[k:k + CHUNK]))))
        ok = {"admitted": [], "beating": []}
        for job_id, attempt in wanted.items():
            r = seen.get(job_id)
            why = None if r is None else rights.refusal(who, r.id, r.team, r.user, r.name)
            if r is None:
                refused.append(Refused(job_id, NotFound(f"job {job_id!r} does not exist")))
            elif why:
                refused.append(Refused(job_id, Forbidden(why)))
            elif r.state in ("admitted", *BEATING) and attempt in (None, r.attempt):
                ok["admitted" if r.state == "admitted" else "beating"].append(job_id)
            else:
                refused.append(Refused(job_id, Conflict(_stale(
                    r, attempt, "admitted or running jobs take heartbeats"))))
        beats = {"lease_expires_at": lease, "rev": QUIET}     # the leader reads none of it
        starts = {"state": "running", "started_at": now, "lease_expires_at": lease}
        for key, states, values in (("beating", BEATING, beats),
                                    ("admitted", ("admitted",), starts)):
            for k in range(0, len(ok[key]), CHUNK):
                part = ok[key][k:k + CHUNK]
                rows = s.execute(_update(JobRow).where(
                    JobRow.id.in_(part), JobRow.state.in_(states), _admission(part, wanted))
                    .values(**values).returning(*ANSWER)).all()
                for j in rows if key == "admitted" else ():
                    svc._event(s, "running", "the launcher confirmed the start", job=j.id)
                beaten += rows
    raced = {i for v in ok.values() for i in v} - {j.id for j in beaten}
    for job_id in sorted(raced):       # its state changed meanwhile: as a single beat
        try:
            beaten.append(jobs.heartbeat(svc, job_id, who, wanted[job_id])[0])
        except (NotFound, Forbidden, Conflict) as exc:
            refused.append(Refused(job_id, exc))
    return beaten, refused


def _admission(part: list[str], wanted: dict[str, int | None]):
    """Each job of `part` still in the admission its launcher started (any, where it
    named none): grouped by admission, so that the database finds the rows by their ids
    (a list of (id, attempt) pairs is compared with every row of the table)."""
    by: dict[int | None, list[str]] = {}
    for i in part:
        by.setdefault(wanted[i], []).append(i)
    return or_(*(JobRow.id.in_(ids) if a is None else (JobRow.attempt == a) & JobRow.id.in_(ids)
                 for a, ids in by.items()))
