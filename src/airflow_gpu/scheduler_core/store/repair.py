"""`airflow-gpu db check` and `db repair` (store/integrity.py decides what is wrong).

Both read in one snapshot: PostgreSQL answers each statement from its own snapshot
unless the transaction is REPEATABLE READ, and holds, allocations and job states read
apart disagree whenever a pass commits in between (a just-admitted job's holds were
found wrong, and deleted). Repair first locks the hold and allocation tables against
writes (PostgreSQL: SHARE ROW EXCLUSIVE, before its snapshot is taken; SQLite: the
write lock its write transactions begin with), so what it found is still so when it
changes it: a job admitted or ended meanwhile waits for it, and is seen whole."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import delete, exc, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from . import integrity
from .db import snapshot
from .integrity import Finding
from .models import AllocationRow, CpuHoldRow, GpuHoldRow, MigHoldRow

ROUNDS = 3            # a rewritten allocation lets go of holds the next round deletes
WAIT = 30.0           # seconds repair waits for the writers in flight to finish
RETRY = ("40001", "40P01", "55P03")   # serialization failure, deadlock, lock not had


@dataclass
class Outcome:
    found: list[Finding]                 # what was wrong before
    done: list[str] = field(default_factory=list)       # what was changed, a line each
    counts: Counter = field(default_factory=Counter)    # "gpu_holds deleted" -> rows
    left: list[Finding] = field(default_factory=list)   # wrong still (repair cannot)

    def summary(self) -> str:
        return ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items())) \
            or "nothing changed"


def check(engine: Engine, cluster_of: Callable[[Session], object]) -> list[Finding]:
    """The wrong rows, read in one snapshot (`cluster_of` reads the cluster in it)."""
    with snapshot(engine) as s:
        return integrity.find(s, cluster_of(s), exact=True)


def repair(engine: Engine, cluster_of: Callable[[Session], object],
           dry_run: bool = False) -> Outcome:
    """Fix what `check` finds that a repair can fix, in one transaction (rolled back on
    a `dry_run`); tried again from the start when PostgreSQL cannot serialize it."""
    deadline = time.monotonic() + WAIT
    pause = 0.02
    while True:
        try:
            with snapshot(engine, write=True, wait=time.monotonic() >= deadline) as s:
                out = _repair(s, cluster_of(s))
                if dry_run:
                    s.rollback()
                return out
        except exc.DBAPIError as e:
            if getattr(e.orig, "sqlstate", None) not in RETRY:
                raise
            if time.monotonic() >= deadline + WAIT:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


def _repair(s: Session, cluster) -> Outcome:
    found = integrity.find(s, cluster, exact=True)
    out = Outcome(found)
    now = found
    for _ in range(ROUNDS):
        todo = [f for f in now if f.action in ("delete", "retire", "rewrite")]
        if not todo:
            break
        for f in todo:
            if _apply(s, f):
                what = {"delete": "deleted", "retire": "marked not live",
                        "rewrite": "rewritten"}[f.action]
                out.counts[f"{f.table} {what}"] += 1
                out.done.append(f"{what} {f.table} {f.key} job={f.job} ({f.problem})")
        s.flush()
        now = integrity.find(s, cluster, exact=True)      # as changed so far
    out.left = [f for f in now if f.action not in ("delete", "retire", "rewrite")]
    return out


def _apply(s: Session, f: Finding) -> bool:
    """Change the row as found (its job included); whether a row changed."""
    if f.table == "allocations":
        q = update(AllocationRow).where(AllocationRow.id == f.index,
                                        AllocationRow.job_id == f.job,
                                        AllocationRow.live.is_(True))
        if f.action == "retire":
            q = q.values(live=False, released_at=datetime.now(UTC))
        else:
            q = q.values(**{k: list(v) for k, v in f.change})
    elif f.table == "gpu_holds":
        q = delete(GpuHoldRow).where(GpuHoldRow.host == f.host, GpuHoldRow.gpu == f.index,
                                     GpuHoldRow.job_id == f.job)
    elif f.table == "cpu_holds":
        q = delete(CpuHoldRow).where(CpuHoldRow.host == f.host, CpuHoldRow.cpu == f.index,
                                     CpuHoldRow.job_id == f.job)
    else:
        q = delete(MigHoldRow).where(MigHoldRow.host == f.host, MigHoldRow.gpu == f.index,
                                     MigHoldRow.device == f.device,
                                     MigHoldRow.job_id == f.job)
    return bool(s.execute(q).rowcount)
