"""Dependencies between jobs on the store (Slurm's `--dependency`): a job (or every element
of an array) waits, pending and `blocked` "dependency" with reason code `Dependency`, until
each job it names has ended as its condition asks (afterok: succeeded; afterany: ended;
afternotok: ended without success; an array: every element). The pass never sees it
until then. When a condition can never hold (afterok on a job that failed, was cancelled,
lost or timed out; afternotok on one that succeeded) the job is cancelled with reason
code `DependencyNeverSatisfied`, naming the job and why.

At submit (batch.py) the references are resolved as the caller's token sees jobs (its
team's; an admin's, all), a job of the same batch by its name first; a cycle among them
is refused. Each pass first evaluates the open rows of `job_dependencies` only (one per
job waited for, per waiting job or array: indexed), so pending jobs without dependencies
cost nothing; a pending reason is rewritten only when it changed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import func, select, true
from sqlalchemy.orm import Session

from ..errors import InputError
from ..jobdeps import file_cycle, file_target
from ..jobfile import file_index
from ..jobspec import JobSpec
from ..store.models import ArrayRow, DependencyRow, EventRow, JobRow
from . import arrays, duedates
from .cancels import cancel_ids
from .common import (
    CHUNK,
    ENDED,
    PENDING,
    WAIT_CODES,
    WAIT_DEPENDENCY,
    Principal,
    _update,
    not_held,
    utcnow,
)
from .depcascade import NEVER, cascade
from .errors import Conflict, NotFound
from .references import resolve
from .uow import Store

CODE = WAIT_CODES[WAIT_DEPENDENCY]
NOT_OK = tuple(s for s in ENDED if s != "succeeded")
WANTS = {"afterok": "to succeed", "afterany": "to end", "afternotok": "to end without "
         "success"}
ROUNDS = 10          # evaluations a pass makes while cancels change what others wait for
                     # (the chain below a cancelled job goes whole at once: depcascade.py)


@dataclass(frozen=True)
class Wait:
    """One job a new job waits for: another job or array (`target`), or one of the same
    batch (`file`: its place in the batch and the element's index, or None)."""

    kind: str
    target: str | None = None
    array: bool = False
    file: tuple[int, int | None] | None = None


# -- at submit --------------------------------------------------------------------------------
def prepare(svc: Store, specs: list[JobSpec], who: Principal) -> list[list[Wait]]:
    """What each job of a batch waits for, resolved; InputError naming the job, the field
    and the reference when one names no job the caller may see, or when jobs of the batch
    wait for each other in a cycle."""
    arrays_of = {s.name: s.array.indexes if s.array else None for s in specs}
    place = {s.name: i for i, s in enumerate(specs)}
    twice = Counter(s.name for s in specs)
    team = None if who.admin else who.team
    out: list[list[Wait]] = []
    for i, spec in enumerate(specs):
        waits = []
        for j, dep in enumerate(spec.depends_on or ()):
            for k, ref in enumerate(dep.jobs):
                where = f"{_which(specs, i)}depends_on[{j}].{dep.kind}[{k}]"
                here = file_target(ref, arrays_of)
                if here is not None and here[0] != spec.name:   # its own: an earlier job's
                    name, element = here
                    if twice.get(name, 0) > 1:
                        raise InputError(f"{where}: {ref!r} names {twice[name]} jobs of the "
                                         "batch; give them names of their own")
                    if element is not None and element not in arrays_of[name]:
                        raise InputError(f"{where}: {ref!r} names element {element} of the "
                                         f"array {name}, which has no such index; use one "
                                         "of its indexes")
                    waits.append(Wait(dep.kind, array=element is None
                                      and arrays_of[name] is not None,
                                      file=(place[name], element)))
                    continue
                try:
                    target = resolve(svc, ref, team)
                except (NotFound, Conflict) as exc:
                    raise InputError(_unresolved(where, ref, who, exc)) from None
                waits.append(Wait(dep.kind, target.id, target.array is not None))
        out.append(waits)
    found = file_cycle(specs)
    if found:
        raise InputError(f"{_which(specs, found[0])}depends_on: {found[1]}")
    return out


def _which(specs: list[JobSpec], i: int) -> str:
    return f"{file_index(i, specs[i].name)}: " if len(specs) > 1 else ""


def _unresolved(where: str, ref: str, who: Principal, exc: Exception) -> str:
    if isinstance(exc, Conflict):      # candidates of the caller's own team only
        return f"{where}: {str(exc).removeprefix('job ')}"
    seen = "any team's jobs" if who.admin else f"team {who.team}'s jobs"
    return (f"{where}: {ref!r} names no job your token can see (a job id, id prefix or "
            f"name of {seen}; an array's NAME_3 for one element); fix the reference")


def rows(owner: str, waits: list[Wait], in_batch) -> list[DependencyRow]:
    """The rows of a new job or array (`owner`); `in_batch(place, element)`: the id of a
    job of the same batch (its array's with element None) and whether it is an array."""
    out = []
    for w in waits:
        target, is_array = (w.target, w.array) if w.file is None else in_batch(*w.file)
        out.append(DependencyRow(owner=owner, kind=w.kind, target=target,
                                 target_array=is_array, open=True))
    return out


def first_reason(spec: JobSpec) -> str:
    """A new dependent job's reason, until the first pass says how its conditions stand."""
    said = ",".join(f"{d.kind}:{':'.join(d.jobs)}" for d in spec.depends_on or ())
    return f"waits for {said} (the next scheduling pass says how they stand)"


# -- each pass --------------------------------------------------------------------------------
@dataclass
class _Target:
    label: str
    state: str                       # a job's, or "N of M ended" for an array
    verdicts: dict[str, str]         # kind -> met | wait | never
    why_not: str = ""                # how it ended, for a condition that never holds


def _job_targets(s: Session, ids: list[str]) -> dict[str, _Target]:
    out = {}
    for i in range(0, len(ids), CHUNK):
        for j in s.execute(select(JobRow.id, JobRow.name, JobRow.state, JobRow.exit_code,
                                  JobRow.array_index).where(JobRow.id.in_(ids[i:i + CHUNK]))):
            name = j.name if j.array_index is None else f"{j.name}_{j.array_index}"
            ended = j.state in ENDED
            ok = j.state == "succeeded"
            out[j.id] = _Target(
                f"{name} ({j.id[:8]})", j.state,
                {"afterok": "met" if ok else "never" if ended else "wait",
                 "afterany": "met" if ended else "wait",
                 "afternotok": "never" if ok else "met" if ended else "wait"},
                f"{'succeeded' if ok else 'ended ' + j.state}"
                + (f" (exit code {j.exit_code})" if j.exit_code not in (None, 0) else ""))
    return out


def _array_targets(s: Session, ids: list[str]) -> dict[str, _Target]:
    out = {}
    for i in range(0, len(ids), CHUNK):
        part = ids[i:i + CHUNK]
        counts: dict[str, dict[str, int]] = {}
        for array_id, state, n in s.execute(
                select(JobRow.array_id, JobRow.state, func.count()).where(
                    JobRow.array_id.in_(part)).group_by(JobRow.array_id, JobRow.state)):
            counts.setdefault(array_id, {})[state] = n
        for a in s.scalars(select(ArrayRow).where(ArrayRow.id.in_(part))):
            c = counts.get(a.id, {})
            ended = sum(n for st, n in c.items() if st in ENDED)
            bad = sum(c.get(st, 0) for st in NOT_OK)
            done = ended >= a.size
            why = ""
            if bad:
                e = s.execute(select(JobRow.id, JobRow.array_index, JobRow.state).where(
                    JobRow.array_id == a.id, JobRow.state.in_(NOT_OK))
                    .order_by(JobRow.array_index).limit(1)).first()
                why = f"(its element {e.array_index}, {e.id[:8]}, ended {e.state})"
            elif done:
                why = "(every element succeeded)"
            out[a.id] = _Target(
                f"array {a.name} ({a.id[:8]})", f"{ended} of its {a.size} elements ended",
                {"afterok": "never" if bad else "met" if done else "wait",
                 "afterany": "met" if done else "wait",
                 "afternotok": ("met" if bad else "never") if done else "wait"}, why)
    return out


def _verdict(deps: list[DependencyRow], targets: dict[str, _Target]) -> tuple[str, str, dict]:
    """(met | wait | never, the reason, details) of one owner's conditions."""
    waiting, said = [], []
    for d in deps:
        t = targets.get(d.target)
        if t is None:             # gone from the store (never in normal operation)
            return "never", f"the job {d.target} it waits for ({d.kind}) no longer exists", {}
        v = t.verdicts[d.kind]
        if v == "never":
            return "never", (f"{t.label} {t.why_not}, but this job waited for it "
                             f"{WANTS[d.kind]} ({d.kind}): it can never start, so it was "
                             "cancelled"), {"job": d.target, "kind": d.kind}
        if v == "wait":
            waiting.append({"kind": d.kind, "job": d.target, "array": d.target_array,
                            "state": t.state})
            said.append(f"{t.label} {WANTS[d.kind]} ({d.kind}; "
                        + (t.state if d.target_array else f"it is {t.state}") + ")")
    if not waiting:
        return "met", "", {}
    return "wait", "waits for " + "; ".join(said), {
        "dependencies": waiting, "waits_for": [w["job"] for w in waiting if not w["array"]]}


def _targets(s: Session, deps: list[DependencyRow]) -> dict[str, _Target]:
    jobs = sorted({d.target for d in deps if not d.target_array})
    many = sorted({d.target for d in deps if d.target_array})
    return {**_job_targets(s, jobs), **_array_targets(s, many)}


def _waiting_owners(s: Session, owners: list[str]) -> dict[str, bool]:
    """Of these owners, those still waiting: owner -> whether it is an array."""
    out: dict[str, bool] = {}
    for i in range(0, len(owners), CHUNK):
        part = owners[i:i + CHUNK]
        blocked = (JobRow.state == PENDING, JobRow.blocked == WAIT_DEPENDENCY)
        out.update((j, False) for j in s.scalars(select(JobRow.id).where(
            JobRow.id.in_(part), *blocked)))
        out.update((a, True) for a in s.scalars(select(JobRow.array_id).where(
            JobRow.array_id.in_(part), *blocked).distinct()))
    return out


def _owned(owner: str, is_array: bool):
    return JobRow.array_id == owner if is_array else JobRow.id == owner


def advance(svc: Store, s: Session) -> dict[str, str | None]:
    """In the pass's transaction, before it reads the pending jobs: let in the jobs whose
    conditions all hold, cancel those that can never start, and refresh the reasons of
    the others that changed. Returns the reasons written (None: the owner waits no
    more), for `svc.dep_reasons` once the pass has committed."""
    said: dict[str, str | None] = {}
    for _ in range(ROUNDS):
        deps = list(s.scalars(select(DependencyRow).where(DependencyRow.open == true())))
        if not deps:
            return said
        by_owner: dict[str, list[DependencyRow]] = {}
        for d in deps:
            by_owner.setdefault(d.owner, []).append(d)
        waiting = _waiting_owners(s, list(by_owner))
        _close(s, [o for o in by_owner if o not in waiting])     # cancelled, or gone
        targets = _targets(s, [d for o in waiting for d in by_owner[o]])
        cancelled: list[str] = []
        now = utcnow()
        # whose pipeline's deadline is lost while they wait (duedates.py)
        risky = duedates.dependency_risks(svc, s, {o: (a, [
            d.target for d in by_owner[o] if not d.target_array]) for o, a in waiting.items()},
            now)
        for owner, is_array in waiting.items():
            verdict, why, details = _verdict(by_owner[owner], targets)
            mine = (_owned(owner, is_array), JobRow.state == PENDING)
            code = CODE
            if verdict == "wait" and owner in risky:
                code, why, details = duedates.dependency_reason(risky[owner], why, details)
            if verdict == "never":
                ids = list(s.scalars(select(JobRow.id).where(*mine)))
                cancelled += cancel_ids(s, ids, why, reason_code=NEVER, reason=why,
                                        details=details)
            elif verdict == "met":
                then = arrays.after_dependencies(s, owner) if is_array else None
                ids = list(s.scalars(select(JobRow.id).where(
                    *mine, JobRow.blocked == WAIT_DEPENDENCY)))
                s.execute(_update(JobRow).where(*mine, JobRow.blocked == WAIT_DEPENDENCY)
                          .values(blocked=then))
                s.execute(_update(JobRow).where(*mine, JobRow.reason_code.in_(
                    (CODE, duedates.AT_RISK))).values(
                    **(_array_reason(s, owner) if then else
                       {"reason_code": None, "reason": None, "details": {}})))
                s.add_all(EventRow(at=now, job_id=i, kind="dependency", message=(
                    "its dependencies hold: the scheduler considers it now" if not then
                    else "its dependencies hold: it waits for its turn in its array"))
                    for i in ids)
            elif svc.dep_reasons.get(owner) != why:
                where = (*mine, JobRow.blocked == WAIT_DEPENDENCY, not_held())
                if code == duedates.AT_RISK:
                    duedates.tell(svc, s, where, why)
                s.execute(_update(JobRow).where(
                    *where, JobRow.reason.is_distinct_from(why)).values(
                    reason_code=code, reason=why, details=details, eta_at=None))
            said[owner] = why if verdict == "wait" else None
            if verdict != "wait":
                _close(s, [owner])
        if not cancelled:
            return said
        # the chains below them, whole, in a read per level; then a round for the rest
        # of what a cancel changes (an afterany on one of them now holds)
        said.update(dict.fromkeys(cascade(s, cancelled)))
    return said


def _array_reason(s: Session, array_id: str) -> dict:
    array = s.get(ArrayRow, array_id)
    return {"reason_code": arrays.CODE, "reason": arrays.wait_reason(array), "details": {}}


def _close(s: Session, owners: list[str]) -> None:
    for i in range(0, len(owners), CHUNK):
        s.execute(_update(DependencyRow).where(DependencyRow.owner.in_(owners[i:i + CHUNK]),
                                               DependencyRow.open == true())
                  .values(open=False))


def reason_for(s: Session, row: JobRow) -> dict:
    """The reason columns of a job waiting for its dependencies now (a held one being
    released: its hold's reason gives way to this)."""
    owner = row.array_id or row.id
    deps = list(s.scalars(select(DependencyRow).where(DependencyRow.owner == owner,
                                                      DependencyRow.open == true())))
    verdict, why, details = _verdict(deps, _targets(s, deps))
    if verdict != "wait":      # the next pass lets it in, or cancels it
        why = "its dependencies are being settled by the next scheduling pass"
    return {"reason_code": CODE, "reason": why, "details": details}
