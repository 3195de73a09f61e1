"""Job arrays on the store (Slurm's `--array`). A spec with `array` becomes one job per
index, all or none in the batch's transaction (batch.py): each element a job of its own
(its own id, state, grant and events) carrying its array's id and index, named as the
spec names the job. The array itself is a row of `job_arrays`.

At most `max_running` elements hold a turn at once: admitted, running, preempting, or
pending and given to the scheduling pass. The others stay pending, `blocked` "array" with
reason code JobArrayTaskLimit (Slurm's), and the pass never sees them, as it never sees a
held job. Each pass first lets the next elements (by index) in as elements end
(`give_turns`), reading only the arrays marked `throttled`; the indexes on jobs
(array_id, state, blocked, array_index) make each count and pick a short index read."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import and_, func, or_, select, true
from sqlalchemy.orm import Session

from ..jobarray import format_indexes
from ..jobspec import JobSpec
from ..store.models import ArrayRow, EventRow, JobRow
from .common import (
    LIVE,
    PENDING,
    WAIT_ARRAY,
    WAIT_CODES,
    _columns,
    _update,
    utcnow,
)

CODE = WAIT_CODES[WAIT_ARRAY]


def wait_reason(array: ArrayRow) -> str:
    """The reason an element waiting for its turn shows (the numbers do not change while
    it waits, so it is written once)."""
    limit = array.max_running
    return (f"array {array.name} ({array.id[:8]}) runs at most {limit} of its {array.size} "
            f"elements at once (max_running {limit}): this one waits until one of the "
            f"{limit} admitted, running or queued ends")


def expand(head: JobRow, spec: JobSpec, blocked: str | None) -> tuple[ArrayRow, list[JobRow]]:
    """The array and its elements, from the row a submit of `spec` would insert (`head`,
    which becomes the first element: its id and idempotency key name the array's
    submit). `blocked`: WAIT_DEPENDENCY when the array waits for dependencies first."""
    indexes = spec.array.indexes
    limit = spec.array.max_running
    array = ArrayRow(id=str(uuid.uuid4()), name=head.name, team=head.team,
                     indexes=format_indexes(indexes), size=len(indexes), max_running=limit,
                     submitted_at=head.submitted_at)
    array.throttled = _limited(array) and blocked is None
    base = _columns(head)
    reason = wait_reason(array)
    rows = []
    for n, index in enumerate(indexes):
        row = JobRow(**{**base, "array_id": array.id, "array_index": index,
                        "blocked": blocked})
        if n:       # the first element answers the submit's key; the others have none
            row.id, row.idempotency_key, row.spec_digest = str(uuid.uuid4()), None, None
            row.submitted_at = head.submitted_at + timedelta(microseconds=n)  # index order
        if blocked is None and limit is not None and n >= limit:
            row.blocked, row.reason_code, row.reason = WAIT_ARRAY, CODE, reason
        rows.append(row)
    return array, rows


def _holding_turns(array_id: str):
    """SQL: the elements that hold a turn: live, or pending and given to the pass."""
    return and_(JobRow.array_id == array_id,
                or_(JobRow.state.in_(LIVE),
                    and_(JobRow.state == PENDING, JobRow.blocked.is_(None))))


def give_turns(svc, s: Session) -> int:
    """In the pass's transaction, before it reads the pending jobs: each throttled array's
    next elements (lowest index first) get the turns its ended elements freed. Returns how
    many were let in."""
    let_in = 0
    now = utcnow()
    for array in s.scalars(select(ArrayRow).where(ArrayRow.throttled == true())):
        free = (array.max_running or array.size) - s.scalar(
            select(func.count()).select_from(JobRow).where(_holding_turns(array.id)))
        if free <= 0:
            continue
        ids = list(s.scalars(select(JobRow.id).where(
            JobRow.array_id == array.id, JobRow.state == PENDING,
            JobRow.blocked == WAIT_ARRAY).order_by(JobRow.array_index).limit(free + 1)))
        turn = ids[:free]
        if len(ids) <= free:
            array.throttled = False         # none waits any more
        if not turn:
            continue
        s.execute(_update(JobRow).where(JobRow.id.in_(turn)).values(blocked=None))
        s.execute(_update(JobRow).where(JobRow.id.in_(turn), JobRow.reason_code == CODE)
                  .values(reason_code=None, reason=None, details={}))   # a hold stays
        s.add_all(EventRow(at=now, job_id=i, kind="array", message=(
            f"its turn in array {array.name} ({array.id[:8]}) came (max_running "
            f"{array.max_running}): the scheduler considers it now")) for i in turn)
        let_in += len(turn)
    return let_in


def after_dependencies(s: Session, array_id: str) -> str | None:
    """What an array's elements wait for once their dependencies hold: their turns when
    max_running is below the array's size (the array is throttled from then on), else
    nothing."""
    array = s.get(ArrayRow, array_id)
    if array is None or not _limited(array):
        return None
    array.throttled = True
    return WAIT_ARRAY


def _limited(array: ArrayRow) -> bool:
    """Whether some of its elements ever wait for a turn."""
    return array.max_running is not None and array.max_running < array.size


def compact_pending(svc, entries: list[tuple[JobRow, dict]]) -> list[tuple[JobRow, dict]]:
    """The queue with each array's elements that the pass does not see yet (waiting for
    their turn or a dependency) as one entry, where the first of them was, as squeue
    shows them (`sweep_[5-99%8]`): the first element's job, with `array_tasks` (their
    indexes, written compactly) and `array_count`. Elements given to the pass and live
    ones keep an entry each."""
    groups: dict[tuple, list[JobRow]] = {}
    for r, _ in entries:
        if r.state == PENDING and r.blocked and r.array_id:
            groups.setdefault((r.array_id, r.reason_code), []).append(r)
    if not groups:
        return entries
    known = arrays_of(svc, [k[0] for k in groups])
    out = []
    for r, extra in entries:
        group = groups.get((r.array_id, r.reason_code)) if r.state == PENDING and r.blocked \
            and r.array_id else None
        if group is None:
            out.append((r, extra))
        elif group[0] is r:
            a = known.get(r.array_id)
            out.append((r, {**extra, "array_count": len(group), "array_tasks": format_indexes(
                [g.array_index for g in group], a.max_running if a else None)}))
    return out


def arrays_of(svc, ids) -> dict[str, ArrayRow]:
    """The arrays of these ids, in one query."""
    ids = [i for i in dict.fromkeys(ids) if i]
    if not ids:
        return {}
    with svc.reads() as s:
        return {a.id: a for a in s.scalars(select(ArrayRow).where(ArrayRow.id.in_(ids)))}
