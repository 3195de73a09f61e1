"""Who may change a job, in one place (docs/service.md, "Who may change a job"): every
route that writes to a job (cancel, bulk cancel, hold, release, update, requeue,
heartbeat, finish) asks `check` (one job) or narrows by `mine` (bulk cancel's filters).

Slurm's rule: a user acts on that user's own jobs; an operator or the team's service
account on all of the team's. Here an admin's token changes any job; a team's token
(no user: the service account Airflow's connection holds) any job of its team; a user's
token only the jobs whose `user` is that user (not the team's jobs that name no user,
nor another user's). Reads stay team-wide: anyone with a token reads the queue."""

from __future__ import annotations

from sqlalchemy import ColumnElement, true

from ..store.models import JobRow
from .common import Principal
from .errors import Forbidden


def by(who: Principal) -> str:
    """How events name who changed a job: `admin ops`, `team vision`, `user alice of team
    vision`."""
    return f"admin {who.team}" if who.admin else who.who


def refusal(who: Principal, job_id: str, team: str, user: str | None,
            name: str | None = None) -> str | None:
    """Why `who` may not change the job (None: it may), naming the job, its owner, the
    token and what to do instead."""
    if who.may_change(team, user):
        return None
    job = f"job {job_id}" + (f" ({name})" if name else "")
    if not who.may_act_for(team):
        return (f"{job} belongs to team {team!r}; your token is for team {who.team!r}: "
                f"use a token of team {team!r} or an admin token")
    owner = f"user {user!r}" if user else "the team itself (submitted without a user)"
    ask = f"ask {user} to (with their token), or " if user else ""
    return (f"{job} of team {team!r} belongs to {owner}; your token is for user "
            f"{who.user!r}, and a user's token changes only that user's jobs: {ask}use "
            f"a token of team {team!r} without --user (its service account) or an admin "
            "token")


def check(who: Principal, row: JobRow) -> None:
    """Forbidden (403) unless `who` may change the job `row`."""
    why = refusal(who, row.id, row.team, row.user, row.name)
    if why:
        raise Forbidden(why)


def mine(who: Principal) -> ColumnElement[bool]:
    """SQL: the jobs of its team `who` may change (a user's token: only that user's)."""
    return JobRow.user == who.user if who.user is not None and not who.admin else true()
