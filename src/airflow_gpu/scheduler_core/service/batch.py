"""Submitting several jobs at once, all or nothing (`POST /api/v1/jobs/batch`: its route
is api/routes/batch.py), and any job with an array or dependencies (one per index and its
dependency rows, in the same transaction: arrays.py, dependencies.py).

Every job is checked as a single submit checks it (`Service.job_row`: the team the token
may act for, the job class, whether it can ever run) before anything is written; any job
refused refuses the batch, naming the job by its index and name. The jobs are then
inserted in one transaction. Idempotency keys work as for single submits: a key seen
before (per team) returns the job it created, a key seen before with another spec is a
Conflict (409), and a batch whose keys were all seen before creates nothing (200).
Batches sharing keys may arrive at once: each inserts its keys in one order (no deadlock),
and one that meets a key inserted meanwhile looks again (ATTEMPTS times, then a 409
naming the key).
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError, OperationalError

from ..errors import InputError
from ..jobarray import MAX_ELEMENTS
from ..jobfile import file_index
from ..jobspec import JobSpec
from ..store.models import ArrayRow, DependencyRow, JobRow
from . import arrays, dependencies, submitlimits
from .common import WAIT_DEPENDENCY, Principal, _columns, same_job
from .core import Service
from .errors import Conflict, Forbidden, NotFound
from .jobs import by_key

MAX_JOBS = 1000      # jobs in one batch (a body is at most 1 MiB anyway)
MAX_ROWS = MAX_ELEMENTS   # jobs one request makes, arrays' elements counted
ATTEMPTS = 5         # lookups and inserts, while concurrent submits insert the same keys


def _which(i: int, spec: JobSpec) -> str:
    return file_index(i, spec.name)          # as `plan` and `submit` name a file's job


def _named(exc: Exception, i: int, spec: JobSpec, single: bool) -> Exception:
    """The same error, its message naming the job of the batch it is about (by index and
    name, instead of the single submit's "job 'NAME': ")."""
    if single:
        return exc
    kind = type(exc) if isinstance(exc, Forbidden | Conflict | NotFound) else InputError
    text, named = str(exc), f"job {spec.name!r}: "
    return kind(f"{_which(i, spec)}: {text.removeprefix(named)}")


def _span(spec: JobSpec) -> int:
    return len(spec.array.indexes) if spec.array else 1


def submit_batch(service: Service, specs: list[JobSpec], who: Principal,
                 keys: list[str | None], single: bool = False) -> tuple[list[JobRow], bool]:
    """Queue every job of `specs` (with its idempotency key, or None) or none of them;
    (rows in the order given, whether any was created). An array's row is its first
    element. `single`: one job of POST /api/v1/jobs (errors name no batch index)."""
    if len(specs) != len(keys):
        raise InputError(f"jobs: {len(specs)} specs but {len(keys)} idempotency keys")
    if not specs:
        raise InputError("jobs: the batch is empty; give at least one job")
    if len(specs) > MAX_JOBS:
        raise InputError(f"jobs: {len(specs)} jobs, over the most a batch may hold, "
                         f"{MAX_JOBS}; split it")
    if len(specs) > 1 and sum(map(_span, specs)) > MAX_ROWS:
        raise InputError(f"jobs: the batch makes {sum(map(_span, specs))} jobs (arrays' "
                         f"elements counted), over the most one request may make "
                         f"({MAX_ROWS}); split it")
    rows: list[JobRow] = []
    seen: dict[tuple[str, str], int] = {}
    for i, (spec, key) in enumerate(zip(specs, keys, strict=True)):
        try:
            row = service.job_row(spec, who, key)
        except (Forbidden, InputError) as exc:      # Rejected is an InputError
            raise _named(exc, i, spec, single) from None
        if row.idempotency_key is not None:
            first = seen.setdefault((row.team, row.idempotency_key), i)
            if first != i:
                raise InputError(f"{_which(i, spec)}: idempotency_key "
                                 f"{row.idempotency_key!r} is also the key of jobs[{first}] "
                                 f"(name {specs[first].name!r}); a key names one job")
        if rows:                      # the queue keeps the order (an array's elements too)
            after = rows[-1].submitted_at + timedelta(microseconds=_span(specs[i - 1]))
            row.submitted_at = max(row.submitted_at, after)
        rows.append(row)
    asks: Counter[tuple[str, str | None]] = Counter()
    for r, spec in zip(rows, specs, strict=True):
        asks[(r.team, r.user)] += _span(spec)
    try:                              # the team's and users' max_submit_jobs, once
        submitlimits.admit(service, asks)
    except submitlimits.OverLimit:
        if not all(r.idempotency_key for r in rows):     # a retry of a stored batch is
            raise                                        # never refused for them
        if any(by_key(service, r.team, r.idempotency_key) is None for r in rows):
            raise
    waits = (dependencies.prepare(service, specs, who) if any(s.depends_on for s in specs)
             else [[] for _ in specs])
    for _ in range(ATTEMPTS):
        try:
            out, created = _store(service, rows, specs, waits, single)
            break
        except (IntegrityError, OperationalError) as exc:
            # A concurrent submit inserted one of these keys after our lookup (or, on
            # PostgreSQL, two batches waited on each other's keys): nothing of this batch
            # was written; look again (now it finds that job).
            if isinstance(exc, OperationalError) and not _retryable(exc):
                raise
            last = exc
    else:
        raise Conflict(_collided(last, rows, specs))
    if created:
        service.wake.set()
    return out, created


def _retryable(exc: OperationalError) -> bool:
    """A deadlock or a serialization failure (PostgreSQL): the transaction may be rerun."""
    return getattr(exc.orig, "sqlstate", None) in ("40P01", "40001")


def _collided(exc: Exception, rows: list[JobRow], specs: list[JobSpec]) -> str:
    """The 409's text once every attempt met a concurrent submit: the job of the batch
    whose key collided when the database names it (PostgreSQL does), else the batch."""
    said = re.search(r"\(team, idempotency_key\)=\((.*), (.*)\) already exists",
                     str(exc.orig) if isinstance(exc, IntegrityError) else "")
    for i, r in enumerate(rows):
        if said and (r.team, r.idempotency_key) == said.groups():
            return (f"{_which(i, specs[i])}: idempotency_key {r.idempotency_key!r} was "
                    f"being submitted by another request at the same time ({ATTEMPTS} "
                    "tries); send the batch again (jobs already created are returned, "
                    "not created twice)")
    return (f"jobs: other requests were submitting the same idempotency keys at the same "
            f"time ({ATTEMPTS} tries); send the batch again (jobs already created are "
            "returned, not created twice)")


def _store(service: Service, rows: list[JobRow], specs: list[JobSpec],
           waits: list[list[dependencies.Wait]], single: bool) -> tuple[list[JobRow], bool]:
    """One transaction: the jobs whose keys were seen before are looked up (and must have
    the same spec), the others inserted with their arrays' elements and the rows of what
    they wait for."""
    by_team: dict[str, list[str]] = {}
    for r in rows:
        if r.idempotency_key is not None:
            by_team.setdefault(r.team, []).append(r.idempotency_key)
    with service.sessions.begin() as s:
        found: dict[tuple[str, str], JobRow] = {}
        for team, keys in by_team.items():
            for k in range(0, len(keys), 500):
                for j in s.scalars(select(JobRow).where(
                        JobRow.team == team,
                        JobRow.idempotency_key.in_(keys[k:k + 500]))):
                    found[(j.team, j.idempotency_key)] = j
        out, new, made = [], [], {}
        for i, r in enumerate(rows):
            old = found.get((r.team, r.idempotency_key)) if r.idempotency_key else None
            if old is None:
                made[i] = _made(r, specs[i], waits[i])
                new += made[i].jobs
                out.append(made[i].jobs[0])
                continue
            try:
                same_job(old, r)
            except Conflict as exc:
                raise _named(exc, i, specs[i], single) from None
            out.append(old)
        if new:
            # Keys in one order for every batch: two batches that share keys then never
            # wait on each other both ways (a deadlock on PostgreSQL); the later one fails
            # on the first shared key and looks again.
            new_sorted = sorted(new, key=lambda r: (r.team, r.idempotency_key or ""))
            s.execute(insert(JobRow), [_columns(r) for r in new_sorted])
            _store_groups(s, made, out, waits)
        s.expunge_all()
    return out, bool(new)


class _Made:
    """A new job's rows: its jobs (an array's elements, else the one job), its array."""

    def __init__(self, jobs: list[JobRow], array: ArrayRow | None):
        self.jobs, self.array = jobs, array
        self.owner = array.id if array is not None else jobs[0].id


def _made(row: JobRow, spec: JobSpec, waits: list) -> _Made:
    blocked = WAIT_DEPENDENCY if waits else None
    if spec.array is not None:
        array, jobs = arrays.expand(row, spec, blocked)
    else:
        array, jobs = None, [row]
        row.blocked = blocked
    if blocked:
        for j in jobs:
            j.reason_code, j.reason = dependencies.CODE, dependencies.first_reason(spec)
    return _Made(jobs, array)


def _store_groups(s, made: dict[int, _Made], out: list[JobRow],
                  waits: list[list[dependencies.Wait]]) -> None:
    """The new arrays, and the rows of what the new jobs wait for (a job of the same
    batch: the one it made, or the one its key made before)."""
    def in_batch(place: int, element: int | None) -> tuple[str, bool]:
        if place in made:
            m = made[place]
            if element is None:
                return m.owner, m.array is not None
            return next(j.id for j in m.jobs if j.array_index == element), False
        first = out[place]
        if first.array_id is None:
            return first.id, False
        if element is None:
            return first.array_id, True
        return s.scalar(select(JobRow.id).where(JobRow.array_id == first.array_id,
                                                JobRow.array_index == element)), False

    new_arrays = [_columns(m.array) for m in made.values() if m.array is not None]
    if new_arrays:
        s.execute(insert(ArrayRow), new_arrays)
    deps = [_columns(d) for i, m in made.items()
            for d in dependencies.rows(m.owner, waits[i], in_batch)]
    if deps:
        s.execute(insert(DependencyRow), [{k: v for k, v in d.items() if k != "id"}
                                          for d in deps])
