"""Admins' reservations in the store: create, update, delete and list them (Slurm's
`scontrol create/update/delete reservation`, `sinfo -T`; Grid Engine's qrsub, qrstat,
qrdel). What a reservation does to passes is windows.py's (the engine's) and
reserving.py's (drains, yields, the jobs that asked for one that ended)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, text

from ..errors import InputError
from ..jobspec import host_names
from ..policy.windows import choose_hosts
from ..store.models import DeletedReservationRow, JobRow, ReservationRow, TeamRow, TokenRow
from ..units import format_duration, parse_duration
from .common import Principal, _ts, utcnow
from .errors import Conflict, Forbidden, NotFound
from .uow import Store

PAST_SLACK = 60.0          # seconds a start may lie in the past (clocks, typing "now")
MAX_SPAN = 366 * 86400.0   # the longest reservation, seconds
# The furthest ahead a reservation may start, seconds: two years is more than any
# maintenance plan needs, and a year such as 9999 is a typo.
MAX_AHEAD = 730 * 86400.0
# pg_advisory_xact_lock(LOCK, hashtext(schema)): reservations are checked and written
# one at a time in each deployment's schema (_one_at_a_time)
LOCK = 0x72737276          # "rsrv"
_RELATIVE = re.compile(r"^now(?:\s*\+\s*(?P<ahead>.+))?$", re.IGNORECASE)


def parse_when(text: str | datetime, now: datetime, field: str) -> datetime:
    """A time as admins write it: ISO 8601 (`2026-12-24T06:00`, UTC unless it says
    otherwise), `now`, or `now+DURATION` (`now+1h`, Slurm's StartTime=now+1hour)."""
    return _when(text, now, field).replace(microsecond=0)     # to the second


def _when(text: str | datetime, now: datetime, field: str) -> datetime:
    if isinstance(text, datetime):
        return text if text.tzinfo else text.replace(tzinfo=UTC)
    raw = str(text).strip()
    m = _RELATIVE.match(raw)
    if m:
        ahead = m.group("ahead")
        try:
            seconds = parse_duration(ahead) if ahead else 0
        except (InputError, ValueError):
            raise InputError(f"{field}: {raw!r}: {ahead!r} is no duration; write e.g. "
                             "now+90m, now+4h or now+1d") from None
        return now + timedelta(seconds=seconds)   # at most 100 years: no overflow
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise InputError(f"{field}: {raw!r} is no time; write an ISO 8601 time "
                         "(2026-12-24T06:00, UTC unless it names a zone), now, or "
                         "now+DURATION (now+1h)") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def known_teams(svc: Store) -> set[str]:
    """Teams the service knows: the policy's, those an admin set, and those with a token
    or a job."""
    with svc.reads() as s:
        names = set(s.scalars(select(TeamRow.name)))
        names |= set(s.scalars(select(TokenRow.team).distinct()))
        names |= set(s.scalars(select(JobRow.team).distinct()))
    return names | set(svc._policy().teams)


def _hosts(svc: Store, hosts: str | list[str]) -> list[str]:
    """The names and ranges as a job's placement.hosts takes them (jobspec.host_names:
    the same ranges and limits), each host named once."""
    entries = [hosts] if isinstance(hosts, str) else list(hosts)
    try:
        names = host_names(entries, repeats=False)
    except (InputError, ValueError) as exc:
        raise InputError(f"hosts: {exc}") from None
    svc.refresh_cluster()
    unknown = [n for n in names if n not in svc.cluster.by_name]
    if unknown:
        have = ", ".join(h.name for h in svc.cluster.hosts[:8])
        raise InputError(f"hosts: {unknown[0]!r} is not a host of the cluster (its hosts: "
                         f"{have}{' ...' if len(svc.cluster.hosts) > 8 else ''}); name hosts "
                         "or ranges of the cluster file (dgx-a-[01-04])")
    if not names:
        raise InputError("hosts: names no host; give names or ranges (dgx-a-[01-04])")
    return names


def _teams(teams: list[str] | None) -> list[str]:
    """The teams as given, each named once."""
    seen: set[str] = set()
    for t in teams or ():
        if t in seen:
            raise InputError(f"teams: {t!r} is named twice; name each team once "
                             f"(--team {t})")
        seen.add(t)
    return list(teams or ())


def _ahead(start_at: datetime, now: datetime) -> None:
    if _ts(start_at) - _ts(now) > MAX_AHEAD:
        raise InputError(f"start: {_utc(start_at)} is more than {format_duration(MAX_AHEAD)} "
                         f"ahead (the latest a reservation may start is "
                         f"{_utc(now + timedelta(seconds=MAX_AHEAD))}); check the year, or "
                         "make it nearer the time")


def _one_at_a_time(s) -> None:
    """Check and write a reservation as the only one being made or changed: the overlap
    check reads what is committed, so two replicas checking at once would both find the
    hosts free. On PostgreSQL a transaction lock, taken before the check and held to the
    commit; SQLite's writers are one at a time already (BEGIN IMMEDIATE, store/db.py)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:k, "
                       "hashtext(coalesce(current_schema(), '')))"), {"k": LOCK})


def _overlapping(s, name: str | None, start: datetime, end: datetime
                 ) -> list[ReservationRow]:
    """Other reservations whose time overlaps [start, end)."""
    return [r for r in s.scalars(select(ReservationRow).where(
        ReservationRow.start_at < end, ReservationRow.end_at > start)) if r.name != name]


def _check(svc: Store, s, name: str | None, hosts: list[str], start: datetime,
           end: datetime, teams: list[str], maint: bool, now: datetime) -> None:
    if end <= start:
        raise InputError(f"end: {_utc(end)} is not after start {_utc(start)}; "
                         "give a later end or a positive duration")
    if _ts(end) - _ts(start) > MAX_SPAN:
        raise InputError(f"duration: {format_duration(_ts(end) - _ts(start))} is longer "
                         f"than a reservation may be ({format_duration(MAX_SPAN)}); split it")
    if _ts(end) <= _ts(now):
        raise InputError(f"end: {_utc(end)} is in the past; a reservation must end "
                         "in the future")
    if maint and teams:
        raise InputError("teams: a maintenance reservation is for no team (no job runs in "
                         "it); leave out the teams or --maint")
    if not maint and not teams:
        raise InputError("teams: a reservation that is not for maintenance names the teams "
                         "whose jobs may run in it (--team T); or make it --maint")
    known = known_teams(svc)
    for t in teams:
        if t not in known:
            raise InputError(f"teams: {t!r} is no team the service knows (a team with a "
                             "token, a job or a policy); create its token first (airflow-gpu "
                             f"token create --team {t}) or fix the name")
    mine = set(hosts)
    for other in _overlapping(s, name, start, end):
        both = sorted(mine & set(other.hosts))
        if both:
            raise InputError(
                f"hosts: {', '.join(both[:4])} {'are' if len(both) > 1 else 'is'} in "
                f"reservation {other.name!r} from {_utc(other.start_at)} to "
                f"{_utc(other.end_at)}, which this one would overlap; choose other "
                "hosts or another time, or change that reservation (airflow-gpu reserve "
                "update)")


def create(svc: Store, who: Principal, name: str, start, end=None,
           duration: float | None = None, hosts: str | list[str] | None = None,
           gpus: int | None = None, gpu_model: str | None = None,
           teams: list[str] | None = None, maint: bool = False) -> tuple[dict, list[dict]]:
    """A new reservation, and the running jobs it will stop (reserving.warn_jobs)."""
    from .reserving import warn_jobs

    if not who.admin:
        raise Forbidden("only admins make reservations")
    now = utcnow()
    start_at = parse_when(start, now, "start")
    if _ts(start_at) < _ts(now) - PAST_SLACK:
        raise InputError(f"start: {_utc(start_at)} is in the past; start now or later "
                         "(start: now)")
    _ahead(start_at, now)
    end_at = _end(start_at, end, duration, now)
    teams = _teams(teams)
    with svc.sessions.begin() as s:
        _one_at_a_time(s)
        if s.get(ReservationRow, name) is not None:
            raise Conflict(f"name: reservation {name!r} exists; pick another name, or "
                           f"change it (airflow-gpu reserve update {name})")
        chosen = _choose(svc, s, name, hosts, gpus, gpu_model, start_at, end_at)
        _check(svc, s, None, chosen, start_at, end_at, teams, maint, now)
        row = ReservationRow(name=name, hosts=chosen, start_at=start_at, end_at=end_at,
                             teams=teams, maint=maint, gpus=gpus, gpu_model=gpu_model,
                             created_at=now, created_by=who.team, drained=[])
        s.add(row)
        s.flush()
        svc._event(s, "reservation", f"{describe(row)} created by {who.team}")
        conflicts = warn_jobs(svc, s, row)
        view_ = view(row, now)
    svc.wake.set()
    return view_, conflicts


def _end(start_at: datetime, end, duration: float | None, now: datetime) -> datetime:
    if (end is None) == (duration is None):
        raise InputError("end: give either an end (--end WHEN) or a duration (--duration "
                         "4h), not both or neither")
    if duration is not None:
        if duration <= 0:
            raise InputError(f"duration: {duration!r} must be more than 0 (e.g. 4h)")
        return start_at + timedelta(seconds=float(duration))
    return parse_when(end, now, "end")


def _choose(svc: Store, s, name: str | None, hosts, gpus: int | None,
            gpu_model: str | None, start_at: datetime, end_at: datetime) -> list[str]:
    if (hosts is None) == (gpus is None):
        raise InputError("hosts: give either hosts (--hosts dgx-[01-04]) or a GPU count "
                         "(--gpus 16, whole hosts are taken), not both or neither")
    if gpu_model is not None and not gpu_model.strip():
        raise InputError(f"gpu_model: {gpu_model!r} names no GPU model; give part of the "
                         "GPU name (A100, H100), or leave it out (any model)")
    if gpu_model is not None and gpus is None:
        raise InputError(f"gpu_model: {gpu_model!r} chooses the hosts of a GPU count; "
                         "give it with gpus (--gpus 16), or leave it out with hosts")
    if hosts is not None:
        return _hosts(svc, hosts)
    if gpus <= 0:
        raise InputError(f"gpus: {gpus} must be 1 or more")
    svc.refresh_cluster()
    taken = {h for r in _overlapping(s, name, start_at, end_at) for h in r.hosts}
    try:
        return choose_hosts(svc.cluster, gpus, gpu_model, taken)
    except ValueError as exc:
        raise InputError(f"gpus: {exc}; ask fewer, another model or another time") from None


def update(svc: Store, who: Principal, name: str, start=None, end=None,
           duration: float | None = None, hosts=None, teams: list[str] | None = None
           ) -> tuple[dict, list[dict]]:
    """Change a reservation's time, hosts or teams (what is left out stays)."""
    from .reservation_jobs import restop
    from .reserving import warn_jobs

    if not who.admin:
        raise Forbidden("only admins change reservations")
    now = utcnow()
    with svc.sessions.begin() as s:
        _one_at_a_time(s)
        row = s.get(ReservationRow, name)
        if row is None:
            raise NotFound(f"reservation {name!r} does not exist (airflow-gpu reserve list)")
        start_at = row.start_at if start is None else parse_when(start, now, "start")
        if start is not None and _ts(start_at) < _ts(now) - PAST_SLACK and \
                _ts(start_at) != _ts(row.start_at):
            raise InputError(f"start: {_utc(start_at)} is in the past; start now or "
                             "later")
        if start is not None:
            _ahead(start_at, now)
        if end is None and duration is None:
            end_at = row.end_at if start is None else start_at + (row.end_at - row.start_at)
        else:
            end_at = _end(start_at, end, duration, now)
        chosen = row.hosts if hosts is None else _hosts(svc, hosts)
        teams = row.teams if teams is None else _teams(teams)
        _check(svc, s, name, chosen, start_at, end_at, teams, row.maint, now)
        row.start_at, row.end_at, row.hosts, row.teams = start_at, end_at, chosen, teams
        if hosts is not None:
            row.gpus = row.gpu_model = None
        s.flush()
        svc._event(s, "reservation", f"{describe(row)}: changed by {who.team}")
        conflicts = warn_jobs(svc, s, row)
        restop(svc, s, row, f"reservation {name!r} was changed")   # its jobs' stop: its end
        view_ = view(row, now)
    svc.wake.set()
    return view_, conflicts


def remove(svc: Store, who: Principal, name: str) -> dict:
    """Delete a reservation: its hosts come back, its yields are lifted, and the pending
    jobs that asked for it are cancelled (as Grid Engine's qrdel removes them)."""
    from .reserving import end_reservation

    if not who.admin:
        raise Forbidden("only admins delete reservations")
    now = utcnow()
    with svc.sessions.begin() as s:
        row = s.get(ReservationRow, name)
        if row is None:
            raise NotFound(f"reservation {name!r} does not exist (airflow-gpu reserve list)")
        out = view(row, now)
        end_reservation(svc, s, row, now, f"reservation {name!r} was deleted")
        if _ts(row.start_at) < _ts(now):      # it held its hosts: accounting keeps it
            s.add(DeletedReservationRow(
                name=row.name, hosts=list(row.hosts), teams=list(row.teams or ()),
                maint=bool(row.maint), start_at=row.start_at,
                end_at=datetime.fromtimestamp(min(_ts(row.end_at), _ts(now)), UTC),
                deleted_at=now, deleted_by=who.team))
        s.execute(delete(ReservationRow).where(ReservationRow.name == name))
        svc._event(s, "reservation", f"{describe(row)} deleted by {who.team}")
    svc.wake.set()
    return out


def listing(svc: Store, include_ended: bool = False) -> list[dict]:
    now = utcnow()
    q = select(ReservationRow).order_by(ReservationRow.start_at, ReservationRow.name)
    if not include_ended:
        q = q.where(ReservationRow.end_at > now)
    with svc.reads() as s:
        return [view(r, now) for r in s.scalars(q)]


def one(svc: Store, name: str) -> dict:
    with svc.reads() as s:
        row = s.get(ReservationRow, name)
        if row is None:
            raise NotFound(f"reservation {name!r} does not exist (airflow-gpu reserve list)")
        return view(row, utcnow())


def state_of(row: ReservationRow, now: datetime) -> str:
    if _ts(row.end_at) <= _ts(now):
        return "ended"
    return "active" if _ts(row.start_at) <= _ts(now) else "upcoming"


def describe(row: ReservationRow) -> str:
    kind = "maintenance reservation" if row.maint else "reservation"
    for_ = "" if row.maint else f" for {', '.join(row.teams)}"
    return (f"{kind} {row.name}{for_} on {', '.join(row.hosts)} from "
            f"{_utc(row.start_at)} to {_utc(row.end_at)}")


def view(row: ReservationRow, now: datetime) -> dict:
    return {"name": row.name, "state": state_of(row, now), "maint": bool(row.maint),
            "hosts": list(row.hosts), "teams": list(row.teams or ()),
            "start": _utc(row.start_at), "end": _utc(row.end_at),
            "duration_s": round(_ts(row.end_at) - _ts(row.start_at)),
            "gpus": row.gpus, "gpu_model": row.gpu_model, "created_by": row.created_by,
            "created_at": _utc(row.created_at), "drained": list(row.drained or ())}


def _utc(at: datetime) -> str:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat(timespec='seconds')
