"""What a job cancelled because its dependencies can never hold takes with it: each job
(or array) that waits for it to succeed (afterok), then each that waits for those, down
the whole chain in the same pass. Slurm cancels such jobs as DependencyNeverSatisfied.

The chain is walked one level at a time with two reads per level (of up to CHUNK jobs:
the open afterok rows on the level's jobs, then their waiting owners), and what it finds
is written at the end in a few statements for all of them, so a chain 2,000 deep costs
about 4,000 short reads in one pass, not several statements per job and a pass per ten
levels (dependencies.ROUNDS)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import or_, select, true
from sqlalchemy.orm import Session

from ..store.bulk import update_rows
from ..store.models import DependencyRow, JobRow
from .common import CHUNK, PENDING, WAIT_DEPENDENCY, _update, event, utcnow

NEVER = "DependencyNeverSatisfied"


@dataclass(frozen=True)
class _Gone:
    """A cancelled job, as its dependents' reasons name it."""

    id: str
    name: str
    array_id: str | None
    array_index: int | None

    def label(self) -> str:
        name = self.name if self.array_index is None else f"{self.name}_{self.array_index}"
        return f"{name} ({self.id[:8]}) ended cancelled"

    def array_label(self) -> str:
        return (f"array {self.name} ({self.array_id[:8]}) (its element {self.array_index}, "
                f"{self.id[:8]}, ended cancelled)")


_COLS = (JobRow.id, JobRow.name, JobRow.array_id, JobRow.array_index)


def _level(s: Session, targets: list[str]) -> list:
    """(owner, target, job...) of each waiting job whose open afterok row names one of
    `targets` (job or array ids): a job owner itself, an array owner's each element. Two
    reads, each from its index (the rows by target, then their owners' jobs), whatever
    the planner's statistics say of a table that just grew by thousands of jobs."""
    deps: dict[str, str] = {}
    for i in range(0, len(targets), CHUNK):
        deps.update((r.owner, r.target) for r in s.execute(
            select(DependencyRow.owner, DependencyRow.target).where(
                DependencyRow.open == true(), DependencyRow.kind == "afterok",
                DependencyRow.target.in_(targets[i:i + CHUNK]))))
    owners, out = list(deps), []
    for i in range(0, len(owners), CHUNK):
        part = owners[i:i + CHUNK]
        for j in s.execute(select(*_COLS).where(
                or_(JobRow.id.in_(part), JobRow.array_id.in_(part)),
                JobRow.state == PENDING, JobRow.blocked == WAIT_DEPENDENCY)):
            owner = j.array_id if j.array_id in deps else j.id
            out.append((owner, deps[owner], j))
    return out


def cascade(s: Session, cancelled: list[str]) -> list[str]:
    """In the pass's transaction, after it cancelled `cancelled` (jobs whose dependencies
    never hold): cancel every job that waits, directly or down a chain, for one of them
    to succeed, each naming the job it waited for. Returns the owners (jobs or arrays)
    cancelled, whose dependency rows are closed."""
    gone: dict[str, _Gone] = {}
    for i in range(0, len(cancelled), CHUNK):
        gone.update((r.id, _Gone(*r)) for r in s.execute(
            select(*_COLS).where(JobRow.id.in_(cancelled[i:i + CHUNK]))))
    said: dict[str, str] = {}      # job or array id -> why it never succeeds, as named
    doomed: dict[str, tuple[str, str]] = {}        # job id -> (its reason, whom it named)
    owners: dict[str, None] = {}
    level = list(gone.values())
    while level:
        front: dict[str, str] = {}
        for g in level:
            front[g.id] = g.label()
            if g.array_id is not None:     # afterok on the whole array never holds either
                front.setdefault(g.array_id, g.array_label())
        front = {k: v for k, v in front.items() if k not in said}
        said.update(front)
        level = []
        for owner, target, r in _level(s, list(front)):
            if r.id in gone:
                continue
            owners[owner] = None
            doomed[r.id] = (f"{said[target]}, but this job waited for it to succeed "
                            "(afterok): it can never start, so it was cancelled", target)
            gone[r.id] = _Gone(r.id, r.name, r.array_id, r.array_index)
            level.append(gone[r.id])
    if doomed:
        _write(s, doomed, list(owners))
    return list(owners)


def _write(s: Session, doomed: dict[str, tuple[str, str]], owners: list[str]) -> None:
    """Cancel the doomed jobs still pending (guarded: one cancelled or ended meanwhile is
    left as it is) with their reasons and events, and close their owners' rows. They
    waited for dependencies, so they hold nothing to release."""
    now, ids, done = utcnow(), list(doomed), []
    for i in range(0, len(ids), CHUNK):
        done += s.scalars(_update(JobRow).where(
            JobRow.id.in_(ids[i:i + CHUNK]), JobRow.state == PENDING).values(
            state="cancelled", finished_at=now, exit_code=None, outcome="cancelled",
            lease_expires_at=None, reason_code=NEVER).returning(JobRow.id)).all()
    if not done:
        return
    update_rows(s.connection(), JobRow.__table__, ("id",), [
        {"id": i, "reason": doomed[i][0],
         "details": {"job": doomed[i][1], "kind": "afterok"}} for i in done])
    for i in done:                # through event(): the webhooks that asked hear of it
        event(s, "cancelled", doomed[i][0], job=i)
    for i in range(0, len(owners), CHUNK):
        s.execute(_update(DependencyRow).where(DependencyRow.owner.in_(owners[i:i + CHUNK]),
                                               DependencyRow.open == true())
                  .values(open=False))
