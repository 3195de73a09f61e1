"""What a new job spec may say that a stored one need not: a `deadline` ahead of now and at
most a year ahead, and `downstream` only with a deadline. A stored spec is read back long
after it was submitted, when its deadline may have passed: it must still parse, so these
checks run only while a spec is being submitted (`submitting()`: `plan`, `submit`, `run`
and the operators through jobfile.py, the API's submit and batch bodies), always in
JobSpec's own validators, never in a second parser."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta

from .fielderrors import shown
from .units import format_duration

# A deadline orders jobs in the hours before it (deadline_slack, 4h by default): one more
# than a year ahead is a typo (9999) or no deadline at all.
MAX_AHEAD = timedelta(days=366)

_NOW: ContextVar[datetime | None] = ContextVar("submitting", default=None)


@contextmanager
def submitting(now: datetime | None = None) -> Iterator[None]:
    """Specs validated inside are new ones, checked against `now` (default: the clock)."""
    token = _NOW.set(now or datetime.now(UTC))
    try:
        yield
    finally:
        _NOW.reset(token)


def submit_now() -> datetime | None:
    """The submit's clock while a new spec is validated; None for a stored one."""
    return _NOW.get()


def stamp(t: datetime) -> str:
    """2026-12-06T10:00:00Z: UTC to the second, as a deadline is written."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_deadline(when: datetime, value: object) -> None:
    """A new spec's deadline (`value` as given, `when` parsed): ahead of now, and at most
    MAX_AHEAD ahead; ValueError naming the value, now and what to write."""
    now = _NOW.get()
    if now is None:
        return
    if when <= now:
        example = (now + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
        raise ValueError(f"{shown(value)} is in the past (now {stamp(now)}); a deadline is "
                         "when the pipeline must be done, still ahead: give a later time "
                         f"with its zone, such as {stamp(example)}, or leave deadline out")
    if when - now > MAX_AHEAD:
        raise ValueError(f"{shown(value)} is more than a year ahead (now {stamp(now)}; the "
                         f"latest accepted is {stamp(now + MAX_AHEAD)}); a deadline orders "
                         "jobs only in the hours before it: give the time the pipeline "
                         "must be done, or leave deadline out")


def check_downstream(downstream: int, deadline: datetime | None) -> None:
    """`downstream` (seconds) is work before a deadline: a new spec gives it with one."""
    if _NOW.get() is not None and downstream > 0 and deadline is None:
        raise ValueError(f"{format_duration(downstream)} is given without a "
                         "deadline; downstream is the work still to run after this job "
                         "before its pipeline's deadline: add deadline (when the pipeline "
                         "must be done), or leave downstream out")
