"""hold, release and update of the jobs references name, an array's elements all at once
(Slurm's `scontrol hold <array id>`, `scontrol update jobid=<array id> TimeLimit=...
ArrayTaskThrottle=N`): `POST /api/v1/jobs/hold`, `/release` and `/update`, whose
references are read as bulk cancel reads them (cancels.py: an array means each of its
elements; `NAME_3` one). Every job named must be the caller's to change (rights.py: 403
naming the first that is not, and nothing changes); then one transaction changes them,
one UPDATE per reference and kind of element (pending; live, by admission), never one per
element. An array's elements the change does not apply to (ended ones; a hold or a
priority for a live one) are passed over, as Slurm passes them over. One job named on
its own gets the answers of the one-job routes (jobcontrol.py: 409 for a hold of a
running job, ...).

The throttle is the array's `max_running` (arrays.py): raised or removed (0), its next
elements get turns at the next pass; lowered, the pending elements over it (highest
indexes first) wait for a turn again, and live ones run on."""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ..errors import InputError
from ..store.models import ArrayRow, JobRow
from . import arrays, jobcontrol
from .cancels import targets_of
from .common import (
    CHUNK,
    HELD,
    LIVE,
    PENDING,
    WAIT_ARRAY,
    Principal,
    _update,
    event,
    not_held,
    utcnow,
)
from .errors import Forbidden
from .references import Target
from .rights import by
from .uow import Store

SHOWN = 10                 # jobs an answer describes (it counts and lists every id)
MOST_RUNNING = 1_000_000   # the largest max_running an update takes (0: no limit)

Named = tuple[str, Target, list[str]]


def _single(named: list[Named]) -> str | None:
    """The job when one reference names one job (not an array): the one-job rules."""
    if len(named) == 1 and named[0][1].array is None:
        return named[0][2][0]
    return None


def _rows(s: Session, ids: list[str], *where) -> list[JobRow]:
    out: list[JobRow] = []
    for i in range(0, len(ids), CHUNK):
        out += s.scalars(select(JobRow).where(JobRow.id.in_(ids[i:i + CHUNK]), *where))
    return out


def _write(s: Session, ids: Iterable[str], where: tuple, values: dict) -> list[str]:
    """One guarded UPDATE (per CHUNK of ids); the ids it changed."""
    ids, done = list(ids), []
    for i in range(0, len(ids), CHUNK):
        done += s.scalars(_update(JobRow).where(JobRow.id.in_(ids[i:i + CHUNK]), *where)
                          .values(**values).returning(JobRow.id)).all()
    return done


def _answer(svc: Store, named: list[Named], changed: list[str],
            arrays_: list[ArrayRow] = ()) -> dict:
    matched = list(dict.fromkeys(i for _, _, ids in named for i in ids))
    with svc.reads() as s:
        rows = {r.id: r for r in _rows(s, matched[:SHOWN])}
    return {"count": len(matched), "matched": matched, "changed": changed,
            "one_job": _single(named) is not None,
            "jobs": [rows[i] for i in matched[:SHOWN] if i in rows],
            "arrays": [{"id": a.id, "name": a.name, "size": a.size,
                        "max_running": a.max_running} for a in arrays_]}


def _how(target: Target) -> str:
    """How a reason tells to undo a change of this reference: the array's short id."""
    a = target.array
    return f"{a.id[:8]} (its array {a.name})" if a is not None else target.job[:8]


# -- hold and release ------------------------------------------------------------------------
def hold_many(svc: Store, refs: list[str], who: Principal) -> dict:
    """Hold every pending job the references name (an admin's hold: JobHeldAdmin, over a
    team's; a team's never over an admin's)."""
    named = targets_of(svc, refs, who, "held")
    one = _single(named)
    if one is not None:
        row = jobcontrol.hold(svc, one, who)
        return _answer(svc, named, [one] if row.reason_code in HELD else [])
    code = "JobHeldAdmin" if who.admin else "JobHeldUser"
    over = or_(not_held(), JobRow.reason_code == "JobHeldUser") if who.admin else not_held()
    details = {"hold": "admin" if who.admin else "user", "hold_by": who.team}
    changed: list[str] = []
    with svc.sessions.begin() as s:
        for _, target, ids in named:
            reason = (f"held by {by(who)}: it is not started until released (airflow-gpu "
                      f"release {_how(target)})")
            done = _write(s, ids, (JobRow.state == PENDING, over), dict(
                reason_code=code, reason=reason, eta_at=None, promised_at=None,
                details={**details, "hold_at": utcnow().isoformat()}))
            for i in done:
                event(s, "held", reason, job=i)
            changed += done
    svc.wake.set()
    return _answer(svc, named, changed)


def release_many(svc: Store, refs: list[str], who: Principal) -> dict:
    """Release every held job the references name (an admin's hold: admins only, 403 for
    the whole request otherwise); each waits again for what it waited for before."""
    named = targets_of(svc, refs, who, "released")
    one = _single(named)
    if one is not None:
        row = jobcontrol.release(svc, one, who)
        return _answer(svc, named, [] if row.reason_code in HELD else [one])
    changed: list[str] = []
    message = f"released by {by(who)}: it is scheduled again"
    with svc.sessions.begin() as s:
        for ref, _, ids in named:
            held = _rows(s, ids, JobRow.state == PENDING, JobRow.reason_code.in_(HELD))
            admins = [r for r in held if r.reason_code == "JobHeldAdmin"]
            if admins and not who.admin:
                r = admins[0]
                raise Forbidden(f"jobs: {ref!r}: job {jobcontrol._named(r)} is held by an "
                                f"admin (JobHeldAdmin, {(r.details or {}).get('hold_by')}); "
                                "only an admin releases it; nothing was released")
            groups: dict[tuple, list[JobRow]] = {}   # what they wait for once released
            for r in held:
                groups.setdefault((r.blocked, r.array_id), []).append(r)
            for rows in groups.values():
                done = _write(s, [r.id for r in rows], (
                    JobRow.state == PENDING, JobRow.reason_code.in_(HELD)), dict(
                    eta_at=None, promised_at=None, **jobcontrol._waiting(s, rows[0])))
                for i in done:
                    event(s, "released", message, job=i)
                changed += done
    svc.wake.set()
    return _answer(svc, named, changed)


# -- update -----------------------------------------------------------------------------------
def update_many(svc: Store, refs: list[str], who: Principal, priority: int | None = None,
                time_limit: int | str | None = None,
                max_running: int | None = None) -> dict:
    """Change the priority (pending jobs), the time limit (pending and live jobs: checked
    as jobcontrol.update checks one job) and, for arrays, the throttle (`max_running`;
    0: none) of every job the references name."""
    if priority is None and time_limit is None and max_running is None:
        raise InputError("update: give --priority, --time-limit and/or --max-running")
    if max_running is not None and not 0 <= max_running <= MOST_RUNNING:
        raise InputError(f"max_running: {max_running} is out of range; give the most "
                         f"elements running at once, 1 to {MOST_RUNNING:,} (0: no limit)")
    named = targets_of(svc, refs, who, "updated")
    for ref, target, _ in named if max_running is not None else ():
        if target.array is None:
            raise InputError(f"max_running: {ref!r} names one job ({target.job[:8]}), not "
                             "an array; name the array (its name or id) to change how "
                             "many of its elements run at once; nothing was updated")
    one = _single(named)
    if one is not None:
        jobcontrol.update(svc, one, who, priority, time_limit)
        return _answer(svc, named, [one])
    plans = _plans(svc, named, who, priority, time_limit)   # refused: nothing changes
    changed: list[str] = []
    throttled: list[ArrayRow] = []
    with svc.sessions.begin() as s:
        for ids, (values, guard, changes) in plans:
            message = f"updated by {by(who)}: " + ", ".join(changes)
            done = _write(s, ids, tuple(guard), values)
            for i in done:
                event(s, "updated", message, job=i)
            changed += done
        arrays_named = {t.array.id: None for _, t, _ in named} if max_running is not None \
            else {}
        for array_id in arrays_named:
            array, told = _throttle(s, array_id, max_running or None, who)
            throttled.append(array)
            changed += told
    svc.wake.set()
    return _answer(svc, named, list(dict.fromkeys(changed)), throttled)


def _plans(svc: Store, named: list[Named], who: Principal, priority, time_limit) -> list:
    """(ids, jobcontrol.plan_update's answer) per kind of element: pending ones with one
    spec, live ones of one admission time and attempt (their time limit runs from it)."""
    if priority is None and time_limit is None:
        return []
    with svc.reads() as s:
        rows = _rows(s, list(dict.fromkeys(i for _, _, ids in named for i in ids)),
                     JobRow.state.in_((PENDING, *LIVE)))
    groups: dict[tuple, list[JobRow]] = {}
    for r in rows:
        live = r.state in LIVE
        if live and time_limit is None:
            continue                      # a priority orders pending jobs only
        key = (r.state, json.dumps(r.spec, sort_keys=True, default=str),
               r.attempt if live else None, r.admitted_at if live else None)
        groups.setdefault(key, []).append(r)
    return [([r.id for r in rows], jobcontrol.plan_update(
        svc, rows[0], who, None if rows[0].state in LIVE else priority, time_limit))
        for rows in groups.values()]


def _throttle(s: Session, array_id: str, limit: int | None, who: Principal
              ) -> tuple[ArrayRow, list[str]]:
    """Set the array's max_running (None: no limit), in the caller's transaction; the
    array, and its elements not ended (each told in its events)."""
    a = s.get(ArrayRow, array_id, with_for_update=True)
    old, a.max_running = a.max_running, limit
    a.throttled = True        # the next pass counts its turns anew (arrays.give_turns)
    if limit is not None:     # over the new limit: the last pending ones wait again
        holding = s.execute(select(JobRow.id, JobRow.state, JobRow.array_index)
                            .where(arrays._holding_turns(a.id))).all()
        back = sorted((h for h in holding if h.state == PENDING),
                      key=lambda h: h.array_index, reverse=True)[:max(0, len(holding) - limit)]
        _write(s, [h.id for h in back], (JobRow.state == PENDING, JobRow.blocked.is_(None)),
               {"blocked": WAIT_ARRAY})
    # the reason of each waiting element says the limit (a hold's reason stays)
    reason = arrays.wait_reason(a) if limit is not None else (
        f"array {a.name} ({a.id[:8]}) has no max_running any more: this one gets its turn "
        "at the next scheduling pass")
    s.execute(_update(JobRow).where(
        JobRow.array_id == a.id, JobRow.state == PENDING, JobRow.blocked == WAIT_ARRAY,
        not_held()).values(reason_code=arrays.CODE, reason=reason, details={}, eta_at=None,
                           promised_at=None))
    said = (f"updated by {by(who)}: its array {a.name} ({a.id[:8]}) runs at most "
            f"{limit or 'all'} of its elements at once (max_running "
            f"{old or 'none'} -> {limit or 'none'})")
    told = list(s.scalars(select(JobRow.id).where(JobRow.array_id == a.id,
                                                  JobRow.state.in_((PENDING, *LIVE)))))
    for i in told:
        event(s, "updated", said, job=i)
    return a, told
