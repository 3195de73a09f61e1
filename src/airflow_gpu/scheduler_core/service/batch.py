"""Submitting several jobs at once, all or nothing (`POST /api/v1/jobs/batch`: its route
is api/routes/batch.py).

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
from datetime import timedelta

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError, OperationalError

from ..errors import InputError
from ..jobspec import JobSpec
from ..store.models import JobRow
from .common import Principal, _columns, same_job
from .core import Service
from .errors import Conflict, Forbidden, NotFound

MAX_JOBS = 1000      # jobs in one batch (a body is at most 1 MiB anyway)
ATTEMPTS = 5         # lookups and inserts, while concurrent submits insert the same keys


def _which(i: int, spec: JobSpec) -> str:
    return f"jobs[{i}] (name {spec.name!r})"


def _named(exc: Exception, i: int, spec: JobSpec) -> Exception:
    """The same error, its message naming the job of the batch it is about (by index and
    name, instead of the single submit's "job 'NAME': ")."""
    kind = type(exc) if isinstance(exc, Forbidden | Conflict | NotFound) else InputError
    text, named = str(exc), f"job {spec.name!r}: "
    return kind(f"{_which(i, spec)}: {text.removeprefix(named)}")


def submit_batch(service: Service, specs: list[JobSpec], who: Principal,
                 keys: list[str | None]) -> tuple[list[JobRow], bool]:
    """Queue every job of `specs` (with its idempotency key, or None) or none of them;
    (rows in the order given, whether any was created)."""
    if len(specs) != len(keys):
        raise InputError(f"jobs: {len(specs)} specs but {len(keys)} idempotency keys")
    if not specs:
        raise InputError("jobs: the batch is empty; give at least one job")
    if len(specs) > MAX_JOBS:
        raise InputError(f"jobs: {len(specs)} jobs, over the most a batch may hold, "
                         f"{MAX_JOBS}; split it")
    rows: list[JobRow] = []
    seen: dict[tuple[str, str], int] = {}
    for i, (spec, key) in enumerate(zip(specs, keys, strict=True)):
        try:
            row = service.job_row(spec, who, key)
        except (Forbidden, InputError) as exc:      # Rejected is an InputError
            raise _named(exc, i, spec) from None
        if row.idempotency_key is not None:
            first = seen.setdefault((row.team, row.idempotency_key), i)
            if first != i:
                raise InputError(f"{_which(i, spec)}: idempotency_key "
                                 f"{row.idempotency_key!r} is also the key of jobs[{first}] "
                                 f"(name {specs[first].name!r}); a key names one job")
        if rows and row.submitted_at <= rows[-1].submitted_at:   # the queue keeps the
            row.submitted_at = rows[-1].submitted_at + timedelta(microseconds=1)  # order
        rows.append(row)
    for _ in range(ATTEMPTS):
        try:
            out, created = _store(service, rows, specs)
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


def _store(service: Service, rows: list[JobRow],
           specs: list[JobSpec]) -> tuple[list[JobRow], bool]:
    """One transaction: the jobs whose keys were seen before are looked up (and must have
    the same spec), the others inserted."""
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
        out, new = [], []
        for i, r in enumerate(rows):
            old = found.get((r.team, r.idempotency_key)) if r.idempotency_key else None
            if old is None:
                new.append(r)
                out.append(r)
                continue
            try:
                same_job(old, r)
            except Conflict as exc:
                raise _named(exc, i, specs[i]) from None
            out.append(old)
        if new:
            # Keys in one order for every batch: two batches that share keys then never
            # wait on each other both ways (a deadlock on PostgreSQL); the later one fails
            # on the first shared key and looks again.
            new_sorted = sorted(new, key=lambda r: (r.team, r.idempotency_key or ""))
            s.execute(insert(JobRow), [_columns(r) for r in new_sorted])
        s.expunge_all()
    return out, bool(new)

