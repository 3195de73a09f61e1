"""Small formatting helpers the page models share (times, sizes, CPU lists, team colours)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from ..scheduler_core.engine.topology import format_cpulist
from ..scheduler_core.units import format_duration, format_size, parse_duration, relative

__all__ = ["age", "due", "duration", "format_cpulist", "format_size", "parse_time",
           "seconds_of", "team_color"]


def parse_time(value: str | None) -> datetime | None:
    """An API timestamp; the service's SQLite store gives naive ones, which are UTC."""
    if not value:
        return None
    t = datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def duration(seconds: float | None) -> str:
    return "—" if seconds is None else format_duration(max(0, seconds))


def age(value: str | None, now: datetime) -> float | None:
    """Seconds from an API timestamp to now."""
    t = parse_time(value)
    return None if t is None else (now - t).total_seconds()


def seconds_of(value: object) -> int | None:
    """A spec's duration field (seconds or "6h"), or None when absent or unreadable."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError:
        return None


def team_color(team: str | None) -> str:
    """A stable colour per team, so one team's GPUs look alike on every page."""
    if not team:
        return "transparent"
    hue = int(hashlib.sha1(team.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue}, 55%, 42%)"


def due(spec: dict, now: datetime) -> str | None:
    """When a job's pipeline is due (the spec's deadline), as the pages say it."""
    t = parse_time(spec.get("deadline"))
    if t is None:
        return None
    return (f"pipeline due {relative((t - now).total_seconds())} "
            f"({t.astimezone(UTC):%m-%d %H:%M} UTC)")
