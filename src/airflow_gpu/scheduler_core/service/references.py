"""Job references, resolved in one place: a whole job id, a unique id prefix (at least 4
characters), a job name, an array (its id, a prefix of it, or its name: every element of
it), and `REF_3`, element 3 of the array REF. A name names the one live or pending job (or
array) of that name; when none is, its newest ended one. NotFound when nothing matches;
Conflict (409) naming the candidates when several do. With a team, only that team's jobs
are seen (a dependency never tells what another team's job is)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import exists, select

from ..jobdeps import element_ref
from ..store.models import ArrayRow, JobRow
from .common import ENDED, LIVE, PENDING
from .errors import Conflict, NotFound
from .uow import Store

MIN_PREFIX = 4                             # the shortest id prefix a reference may be
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PREFIX = re.compile(r"^[0-9a-f-]+$")
SHOWN = 5                                  # candidates named in an ambiguity error
NAMED = 50                                 # arrays of one name looked at, newest first


@dataclass(frozen=True)
class Target:
    """What a reference names: one job, or an array (all of its elements)."""

    job: str | None = None
    array: ArrayRow | None = None
    name: str = ""
    state: str = ""                        # a job's state; an array's: live or ended
    at: object = None                      # when it was submitted (the newest ended wins)

    @property
    def id(self) -> str:
        return self.job or self.array.id

    def describe(self) -> str:
        if self.array is not None:
            return (f"array {self.array.id} ({self.name}, {self.array.size} jobs, "
                    f"{self.state})")
        return f"{self.job} ({self.name}, {self.state})"


def _live_array(s, array_id: str) -> bool:
    return bool(s.scalar(select(exists().where(JobRow.array_id == array_id,
                                               JobRow.state.in_((PENDING, *LIVE))))))


def _array(s, a: ArrayRow) -> Target:
    return Target(array=a, name=a.name, state="live" if _live_array(s, a.id) else "ended",
                  at=a.submitted_at)


def _arrays(s, ref: str, team: str | None) -> tuple[list[Target], list[Target]]:
    """(arrays whose id or id prefix is `ref`, arrays named `ref`)."""
    scope = (ArrayRow.team == team,) if team else ()
    by_id = []
    if len(ref) >= MIN_PREFIX and _PREFIX.match(ref):
        by_id = [_array(s, a) for a in s.scalars(
            select(ArrayRow).where(ArrayRow.id.like(ref + "%"), *scope)
            .order_by(ArrayRow.id).limit(SHOWN + 1))]
    # the newest of that name (a name reused every night need not read every array)
    named = [_array(s, a) for a in s.scalars(
        select(ArrayRow).where(ArrayRow.name == ref, *scope)
        .order_by(ArrayRow.submitted_at.desc()).limit(NAMED))]
    return by_id, named


def _candidates(s, ref: str, team: str | None) -> tuple[list[Target], list[Target]]:
    """(what `ref` names by id or id prefix, what it names by name: jobs outside arrays
    and arrays)."""
    scope = (JobRow.team == team,) if team else ()
    by_id = [Target(job=j.id, name=j.name, state=j.state)
             for j in s.execute(select(JobRow.id, JobRow.name, JobRow.state)
                                .where(JobRow.id == ref, *scope))]
    if not by_id and len(ref) >= MIN_PREFIX and _PREFIX.match(ref):
        by_id = [Target(job=j.id, name=j.name, state=j.state)
                 for j in s.execute(select(JobRow.id, JobRow.name, JobRow.state)
                                    .where(JobRow.id.like(ref + "%"), *scope)
                                    .order_by(JobRow.id).limit(SHOWN + 1))]
    arrays_by_id, arrays_named = _arrays(s, ref, team)
    named = [Target(job=j.id, name=j.name, state=j.state, at=j.submitted_at)
             for j in s.execute(select(JobRow.id, JobRow.name, JobRow.state,
                                       JobRow.submitted_at)
                                .where(JobRow.name == ref, JobRow.array_id.is_(None), *scope)
                                .order_by(JobRow.submitted_at.desc(), JobRow.id.desc()))]
    return by_id + arrays_by_id, named + arrays_named


def _one(ref: str, by_id: list[Target], named: list[Target], what: str = "job") -> Target:
    live = [t for t in named if t.state not in ENDED and t.state != "ended"]
    oldest = datetime.min.replace(tzinfo=UTC)
    newest = sorted(named, key=lambda t: t.at or oldest, reverse=True)[:1]
    found = {t.id: t for t in [*by_id, *(live or newest)]}
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        hint = (f" (an id prefix needs at least {MIN_PREFIX} characters)"
                if len(ref) < MIN_PREFIX and _PREFIX.match(ref) else "")
        raise NotFound(f"{what} {ref!r} does not exist: no {what} has that id, id prefix "
                       f"or name{hint}")
    kind = ("several live jobs are named" if len(live) > 1 and not by_id
            else "it names several jobs:")
    shown = list(found.values())[:SHOWN]
    more = "" if len(found) <= SHOWN else " and more"
    raise Conflict(f"{what} {ref!r} is ambiguous: {kind} "
                   + ", ".join(t.describe() for t in shown) + more + "; give more of the id")


def _element(s, ref: str, team: str | None) -> Target | None:
    """`NAME_3`: element 3 of the array NAME (by id, id prefix or name), else None."""
    parts = element_ref(ref)
    if parts is None:
        return None
    arrays_by_id, arrays_named = _arrays(s, parts[0], team)
    if not arrays_by_id and not arrays_named:
        return None
    array = _one(parts[0], arrays_by_id, arrays_named, "array").array
    job = s.execute(select(JobRow.id, JobRow.name, JobRow.state).where(
        JobRow.array_id == array.id, JobRow.array_index == parts[1])).first()
    if job is None:
        raise NotFound(f"array {array.name} ({array.id[:8]}) has no element {parts[1]} "
                       f"(its indexes: {array.indexes})")
    return Target(job=job.id, name=f"{job.name}_{parts[1]}", state=job.state)


def resolve(svc: Store, ref: str, team: str | None = None) -> Target:
    """The job or array `ref` names (only `team`'s with a team)."""
    with svc.reads() as s:
        by_id, named = _candidates(s, ref, team)
        if len(by_id) == 1 and by_id[0].id == ref:
            return by_id[0]                 # a whole id
        element = _element(s, ref, team)
    if element is not None:
        by_id.append(element)
    return _one(ref, by_id, named)


def resolve_job(svc: Store, ref: str) -> str:
    """The one job `ref` names (the job routes): a whole id is taken as it is, without a
    lookup (the launchers' hot path); an array is a Conflict naming the way to one of its
    elements."""
    if _UUID.match(ref):
        return ref
    target = resolve(svc, ref)
    if target.array is not None:
        a = target.array
        first = a.indexes.split(",")[0].split("-")[0]
        raise Conflict(f"job {ref!r} is the array {a.id[:8]} ({a.name}, {a.size} jobs): "
                       f"this takes one job; name one element as {ref}_{first} (queue "
                       f"shows them), or act on them all with airflow-gpu cancel, hold, "
                       f"release or update {ref}")
    return target.job
