"""Cancelling many jobs at once, as Slurm's `scancel` with filters (`-u`, `-t`, `-n`) or
an array's id: `POST /api/v1/jobs/cancel` with job references (an array means each of
its elements) and filters, all of which a job must match; `dry_run` answers what would be
cancelled. A team token only ever matches its own team's jobs, a user's token only that
user's (rights.py); an admin's, any.

The filters are one dataclass and one condition each (`Filters.where`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import InputError
from ..store.models import JobRow
from .common import CHUNK, LIVE, PENDING, Principal, _update, event, release_many, utcnow
from .errors import Forbidden
from .references import Target, resolve
from .rights import by, mine, refusal
from .uow import Store

CANCELLABLE = (PENDING, *LIVE)
SHOWN = 10                 # jobs an answer describes (it counts and lists every id)


def cancel_ids(s: Session, ids: list[str], message: str, **reason) -> list[str]:
    """In the caller's transaction: each of these jobs still pending or live becomes
    `cancelled` (guarded, so an admission or an end meanwhile is never overwritten), frees
    what it holds and gets an event saying `message`. Returns those cancelled."""
    now = utcnow()
    done: list[str] = []
    for i in range(0, len(ids), CHUNK):
        done += s.scalars(_update(JobRow).where(
            JobRow.id.in_(ids[i:i + CHUNK]), JobRow.state.in_(CANCELLABLE)).values(
            state="cancelled", finished_at=now, exit_code=None, outcome="cancelled",
            lease_expires_at=None, **reason).returning(JobRow.id)).all()
    release_many(s, done)
    for i in done:                # through event(): the webhooks that asked hear of it
        event(s, "cancelled", message, job=i)
    return done


@dataclass
class Filters:
    """What a bulk cancel matches: every filter given must hold."""

    jobs: list[str] = field(default_factory=list)     # references (arrays: every element)
    team: str | None = None
    state: str | None = None
    name: str | None = None
    submitted_before: datetime | None = None          # what a dry run saw, and no later
    user: str | None = None

    def given(self) -> bool:
        return bool(self.jobs or self.team or self.state or self.name or self.user)

    def where(self, who: Principal, ids: list[str] | None) -> list:
        """The conditions on jobs (ids: those the references name, None: no reference)."""
        team = self.team if who.admin else who.team      # a team token: its own jobs
        out = [JobRow.state.in_((self.state,) if self.state else CANCELLABLE), mine(who)]
        out += [JobRow.team == team] if team else []
        out += [JobRow.name == self.name] if self.name else []
        out += [JobRow.user == self.user] if self.user else []
        out += [JobRow.submitted_at <= self.submitted_before] if self.submitted_before else []
        out += [JobRow.id.in_(ids)] if ids is not None else []
        return out


def _referenced(svc: Store, refs: list[str], who: Principal) -> list[str]:
    """The jobs the references name (an array: its elements), each the caller's to
    cancel (403 naming the first that is not: rights.py)."""
    ids = [i for _, _, these in targets_of(svc, refs, who) for i in these]
    return list(dict.fromkeys(ids))


def targets_of(svc: Store, refs: list[str], who: Principal, done: str = "cancelled"
               ) -> list[tuple[str, Target, list[str]]]:
    """(reference, its target, the ids of its jobs: an array's elements by index) of each
    reference, every job the caller's to change (403 naming the first that is not, and
    that nothing was `done`: rights.py). hold, release and update take them so too
    (bulkcontrol.py)."""
    out = []
    for ref in refs:
        target = resolve(svc, ref)
        if target.array is not None:
            with svc.reads() as s:
                jobs = s.execute(select(JobRow.id, JobRow.team, JobRow.user, JobRow.name)
                                 .where(JobRow.array_id == target.array.id)
                                 .order_by(JobRow.array_index)).all()
        else:
            jobs = [svc.get(target.job)]
        for j in jobs:
            why = refusal(who, j.id, j.team, j.user, j.name)
            if why:
                raise Forbidden(f"jobs: {ref!r}: {why}; nothing was {done}")
        out.append((ref, target, [j.id for j in jobs]))
    return out


def check(f: Filters, who: Principal) -> None:
    if not f.given():
        raise InputError("cancel: give job references (jobs) or at least one filter (team, "
                         "user, state, name); nothing was cancelled")
    if f.state is not None and f.state not in CANCELLABLE:
        raise InputError(f"state: {f.state!r} jobs have ended and cannot be cancelled; use "
                         f"one of {', '.join(CANCELLABLE)}")
    if f.team and not who.may_act_for(f.team):
        raise Forbidden(f"team: your token is for team {who.team!r}; it cancels only that "
                        f"team's jobs, not {f.team!r}'s")
    if f.user and who.user is not None and not who.admin and f.user != who.user:
        raise Forbidden(f"user: your token is for user {who.user!r} of team {who.team!r}; "
                        f"it cancels only that user's jobs, not user {f.user!r}'s: ask "
                        f"{f.user} to, or use a token of team {who.team!r} without --user "
                        "(its service account) or an admin token")


def bulk_cancel(svc: Store, f: Filters, who: Principal, dry_run: bool = False) -> dict:
    """The jobs matching `f` (`matched`, ids in submit order) and, unless `dry_run`, those
    cancelled in one transaction (`cancelled`); `jobs`: the first few described."""
    check(f, who)
    ids = _referenced(svc, f.jobs, who) if f.jobs else None
    cond = f.where(who, None)
    matched: list = []
    with (svc.reads() if dry_run else svc.sessions.begin()) as s:
        for i in range(0, len(ids), CHUNK) if ids is not None else (None,):
            part = ids[i:i + CHUNK] if i is not None else None
            matched += s.execute(select(
                JobRow.id, JobRow.name, JobRow.team, JobRow.state, JobRow.array_id,
                JobRow.array_index, JobRow.submitted_at).where(
                *cond, *([JobRow.id.in_(part)] if part is not None else []))).all()
        matched.sort(key=lambda j: (j.submitted_at, j.id))
        cancelled: list[str] = []
        if not dry_run and matched:
            done = set(cancel_ids(s, [j.id for j in matched],
                                  f"cancelled by {by(who)} (airflow-gpu cancel {_said(f)})"))
            cancelled = [j.id for j in matched if j.id in done]
    if cancelled:
        svc.wake.set()
    return {"dry_run": dry_run, "as_of": utcnow(), "count": len(matched),
            "matched": [j.id for j in matched], "cancelled": cancelled,
            "jobs": [{"id": j.id, "name": j.name, "team": j.team, "state": j.state,
                      "array_id": j.array_id, "array_index": j.array_index}
                     for j in matched[:SHOWN]]}


def _said(f: Filters) -> str:
    """The request in the words of the command line, for the jobs' events."""
    words = list(f.jobs)
    words += [f"--{k} {v}" for k, v in (("team", f.team), ("user", f.user),
                                       ("state", f.state), ("name", f.name)) if v]
    return " ".join(words)
