"""A job's pipeline deadline as the API shows it (JobOut, ExplainOut; `status`,
`explain`): when its pipeline must be done (`pipeline_deadline_at`, the spec's `deadline`;
`deadline_at` is another time, its time limit's end), how much time it has to spare
(`deadline_slack_s`) and whether it is at risk (`deadline_at_risk`).

The slack is what the job may still lose and its pipeline end in time: a waiting job's,
its latest start less now (deadline - (planned runtime + downstream) - now, as `prio`
shows it); a live job's, deadline - downstream - its expected end (its start plus its
planned runtime, or now once it runs past that); an ended job's, the same with its end.
Negative: the pipeline is late by that much. At risk: a live job whose expected end is
after deadline - downstream, and a waiting one the pass found at risk (`DeadlineAtRisk`,
also where a job it depends on is expected to end after its latest start, or has lost
its deadline: `dependency_risks`, each pass) or whose latest start has passed. The
planned runtime is the spec's (its class's, else the policy's default_runtime), without
the team's learned factor or a gang's slowdown."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session

from ..jobclasses import resolve
from ..jobspec import JobSpec
from ..policy.scheduler import planned_runtime
from ..store.models import JobRow
from ..units import format_duration, parse_deadline, parse_duration
from .common import CHUNK, ENDED, LIVE, PENDING, _ts
from .uow import Store

AT_RISK = "DeadlineAtRisk"


def planned(svc: Store, spec: dict, name: str) -> float | None:
    """The runtime a job with this stored spec is planned with (None: unreadable)."""
    policy = svc._policy()
    try:
        parsed = resolve(JobSpec.model_validate({**spec, "name": name}),
                         svc.reg.job_classes, defaults=policy.defaults)
    except Exception:     # noqa: BLE001 - a spec the pass cannot read either: no slack
        return None
    return planned_runtime(parsed, policy)


def deadline_of(spec: dict | None) -> datetime | None:
    """When the job's pipeline must be done (its spec's deadline), None without one."""
    raw = (spec or {}).get("deadline")
    try:
        return parse_deadline(raw) if raw else None
    except ValueError:
        return None


def due(svc: Store, row: JobRow, now: float) -> dict:
    """The API's deadline fields of `row` ({} for a job without a deadline)."""
    deadline = deadline_of(row.spec)
    if deadline is None:
        return {}
    out = {"pipeline_deadline_at": deadline}
    runtime = planned(svc, row.spec, row.name)
    if runtime is None:
        return out
    downstream = parse_duration((row.spec or {}).get("downstream") or 0)
    slack = slack_of(row, _ts(deadline) - downstream, runtime, now)
    if slack is None:
        return out
    live = row.state in LIVE
    pending = row.state == PENDING
    risky = (live and slack < 0) or (pending and (slack < 0 or row.reason_code == AT_RISK))
    return {**out, "deadline_slack_s": round(slack), "deadline_at_risk": risky}


def slack_of(row: JobRow, due_end: float, runtime: float, now: float) -> float | None:
    """How much later than planned the job may start (waiting) or end (live, ended) for
    its pipeline to end in time (`due_end`: the deadline less the work after it)."""
    if row.state == PENDING:
        latest = (row.details or {}).get("latest_start") if row.reason_code == AT_RISK \
            else None       # the pass's own, with the team's factor and the slowdown
        if not isinstance(latest, int | float):
            latest = due_end - runtime
        return latest - now
    if row.state in LIVE and row.admitted_at is not None:
        return due_end - expected_end(row, runtime, now)
    if row.state in ENDED and row.finished_at is not None and row.admitted_at is not None:
        return due_end - _ts(row.finished_at)
    return None


def expected_end(row: JobRow, runtime: float, now: float) -> float:
    """A live job's expected end: its start plus its planned runtime, or now once past it."""
    return max(now, _ts(row.admitted_at) + runtime)


def stamp(epoch: float) -> str:
    """2026-12-06T06:00Z, as the messages write a time."""
    if not math.isfinite(epoch):
        return "never"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%MZ")


# -- jobs waiting for their dependencies (dependencies.py) ---------------------------------
def _with_deadline(s: Session, ids: list[str]) -> dict[str, JobRow]:
    """The rows of these jobs whose spec has a deadline (filtered in the database: most
    waiting jobs have none, and their specs are never read)."""
    out: dict[str, JobRow] = {}
    for i in range(0, len(ids), CHUNK):
        out.update((r.id, r) for r in s.scalars(select(JobRow).where(
            JobRow.id.in_(ids[i:i + CHUNK]),
            cast(JobRow.spec, Text).contains('"deadline"'))))
    return out


def _label(row: JobRow) -> str:
    name = row.name if row.array_index is None else f"{row.name}_{row.array_index}"
    return f"{name} ({row.id[:8]})"


def _due_end(row: JobRow) -> tuple[float, float] | None:
    """(its pipeline's deadline, that less the work after it) as Unix time."""
    try:
        deadline = _ts(parse_deadline(row.spec["deadline"]))
        return deadline, deadline - parse_duration(row.spec.get("downstream") or 0)
    except (ValueError, TypeError):
        return None


def _lost(svc: Store, row: JobRow, now: float) -> str | None:
    """Why a job's pipeline can no longer end by its deadline (None: it still can): live
    and expected to end too late, or waiting past its latest start or behind such a job.
    In absolute times, so the reason stays the same from pass to pass."""
    due, runtime = _due_end(row), planned(svc, row.spec, row.name)
    if due is None or runtime is None:
        return None
    deadline, end_by = due
    head = (f"{_label(row)} cannot end by {stamp(end_by)}, the latest its pipeline (due "
            f"{stamp(deadline)}) allows")
    if row.state in LIVE and row.admitted_at is not None:
        planned_end = _ts(row.admitted_at) + runtime
        if planned_end > end_by:
            return f"{head}: it is expected to end {stamp(planned_end)}"
        if now > end_by:
            return f"{head}: it is still running, past its expected end"
    elif row.state == PENDING:
        if end_by - runtime < now:
            return f"{head}: its latest start, {stamp(end_by - runtime)}, has passed"
        if row.reason_code == AT_RISK and (row.details or {}).get("lost_by"):
            return f"{head}: it waits for a job that lost its deadline"
    return None


def _end(svc: Store, row: JobRow, now: float) -> tuple[float, str] | None:
    """When a job another waits for is expected to end at the earliest, and that in
    words that stay the same from pass to pass (None: not known)."""
    runtime = planned(svc, row.spec, row.name)
    if runtime is None:
        return None
    if row.state in LIVE and row.admitted_at is not None:
        end = _ts(row.admitted_at) + runtime
        return ((end, f"is expected to end {stamp(end)}") if end >= now else
                (now, f"is still running, past its expected end {stamp(end)}"))
    if row.state == PENDING:
        return now + runtime, f"has not started and needs {format_duration(runtime)}"
    return None


def dependency_risks(svc: Store, s: Session, waits: dict[str, tuple[bool, list[str]]],
                     now: datetime) -> dict[str, dict]:
    """Of the jobs waiting for their dependencies (owner -> (an array?, the jobs it waits
    for)), those whose pipeline is at risk. With a deadline of its own: a job it waits
    for (one with a deadline: the others' specs are never read) is expected to end after
    its latest start, or its latest start has passed while it waits. Without: a job it
    waits for has lost its deadline (`_lost`), so the pipeline they share has. Returns
    owner -> {"why", and details "deadline", "latest_start", "lost_by"}."""
    t_now = _ts(now)
    owners = [o for o, (array, _) in waits.items() if not array]
    rows = _with_deadline(s, sorted({t for _, ts in waits.values() for t in ts}
                                    | set(owners)))
    out = {}
    for owner, (_, targets) in waits.items():
        mine = rows.get(owner)
        due = _due_end(mine) if mine is not None else None
        runtime = planned(svc, mine.spec, mine.name) if due else None
        if not runtime:           # no deadline of its own: one it waits for that is lost
            by = next(((t, why) for t in targets if t in rows
                       and (why := _lost(svc, rows[t], t_now))), None)
            if by is not None:
                out[owner] = {"why": by[1], "lost_by": by[0]}
            continue
        latest = due[1] - runtime
        details = {"deadline": due[0], "latest_start": latest}
        for t in targets:
            end = _end(svc, rows[t], t_now) if t in rows else None
            if end is not None and end[0] > latest:
                out[owner] = {"why": f"{_label(rows[t])}, which it waits for, {end[1]}, "
                              f"after this job's latest start, {stamp(latest)}, for its "
                              f"pipeline due {stamp(due[0])}", **details, "lost_by": t}
                break
        else:
            if latest < t_now:
                out[owner] = {"why": f"its latest start, {stamp(latest)}, for its pipeline "
                              f"due {stamp(due[0])}, has passed while it waits", **details}
    return out


def dependency_reason(risk: dict, why: str, details: dict) -> tuple[str, str, dict]:
    """A waiting job's reason columns when its pipeline is at risk (its cause kept)."""
    return (AT_RISK, f"deadline at risk: {risk['why']}. Waiting for: Dependency: {why}",
            {**details, "cause": "Dependency", **{k: v for k, v in risk.items()
                                                  if k != "why"}})


def tell(svc: Store, s: Session, where: tuple, why: str) -> None:
    """Before the reason is written: an event `deadline` (and the webhooks that asked for
    it) for each job (`where`) that turns at risk while waiting for its dependencies,
    once, as the pass tells a waiting job of the queue (storepass.py)."""
    for job_id in list(s.scalars(select(JobRow.id).where(
            *where, JobRow.reason_code.is_distinct_from(AT_RISK)))):
        svc._event(s, "deadline", why, job=job_id)
