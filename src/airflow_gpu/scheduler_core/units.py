"""Human sizes (`8GiB`, `8G`, `48GB`, `512MiB`) and durations (`90m`, `6h`, `2d`).

A size needs a unit: `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` are binary (powers
of 1024: `8G` is 8GiB, as Slurm's --mem=8G), `KB`, `MB`, `GB`, `TB` decimal (powers of
1000), `B` bytes. A bare number (`memory: 48`, "48") is refused, never read as bytes: 48 of
what is the user's to say. 0 alone needs none (0 of anything is nothing)."""

from __future__ import annotations

import math
import re
from datetime import date, datetime
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,         # Slurm's: --mem=8G is 8GiB
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20,
    "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}
SIZE_UNITS_HELP = ("B; K, M, G, T or KiB, MiB, GiB, TiB (binary: 8G is 8GiB, as in Slurm); "
                   "KB, MB, GB, TB (decimal)")
_SIZE_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
# The largest a size or a duration may be: a size fits a signed 64-bit integer (the
# database's BIGINT, any host's memory many times over); a duration is at most 100 years,
# so a deadline computed from it stays a date. Infinity, NaN and numbers such as 1e400
# (which JSON parsers read as infinity) are refused with a message naming them.
MAX_SIZE = 2**63 - 1
MAX_DURATION = 100 * 365 * 86400


def _show(value: object) -> str:
    """The value as an error quotes it: at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _finite(number: float, value: object, what: str, example: str) -> None:
    if not math.isfinite(number):
        raise ValueError(f"{_show(value)} is not a finite number (NaN, Infinity and numbers "
                         f"too large to hold, such as 1e400, are refused); give a {what} "
                         f"such as {example}")


def parse_size(value: object) -> int:
    """Bytes from a string such as `8GiB` or `8G` (binary) or `48GB` (decimal), `4096B`
    (bytes). A number without a unit is refused (but 0)."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is a yes/no value, not a size; write one such "
                         "as 8GiB")
    if isinstance(value, int) and abs(value) > MAX_SIZE:     # float() would overflow
        number, unit = 2.0**64 if value > 0 else -1.0, ""
    elif isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise ValueError(f"{_show(value)} is not a size; write one such as 8GiB, 48GB or "
                         "512MiB")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {_show(unit)} in {_show(value)}; use "
                         f"{SIZE_UNITS_HELP}")
    _finite(number, value, "size", "8GiB")
    if number < 0:
        raise ValueError(f"size {_show(value)} is negative; give 0 or more, such as 8GiB")
    size = int(value) if isinstance(value, int) else int(number * _SIZE_UNITS[unit])
    if size > MAX_SIZE:
        raise ValueError(f"size {_show(value)} is over the largest there is, {MAX_SIZE} bytes "
                         "(8 EiB); give a size such as 8GiB")
    if not unit and number != 0:
        shown = m.group(1) if isinstance(value, str) else _show(value)
        raise ValueError(f"size {_show(value)} has no unit; write e.g. {shown}GiB, {shown}MiB "
                         f"or {shown}B for bytes (units: {SIZE_UNITS_HELP})")
    return size


def parse_duration(value: object) -> int:
    """Seconds from a number or a string such as `90m`, `6h`, `2d` or `1h30m`."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is a yes/no value, not a duration; write one "
                         "such as 90m")
    if isinstance(value, int) and abs(value) > MAX_DURATION:
        seconds = MAX_DURATION + 1.0 if value > 0 else -1.0     # float() could overflow
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if text.startswith("-"):
            raise ValueError(f"duration {_show(value)} is negative; give 0 or more, such "
                             "as 90m")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        elif text and _DURATION_RE.sub("", text) == "":
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_RE.findall(text))
        else:
            raise ValueError(f"{_show(value)} is not a duration; write one such as 30s, "
                             "90m, 6h, 2d or 1h30m")
    else:
        raise ValueError(f"{_show(value)} is not a duration; write one such as 90m or 6h")
    _finite(seconds, value, "duration", "90m")
    if seconds < 0:
        raise ValueError(f"duration {_show(value)} is negative; give 0 or more, such as "
                         "90m")
    if seconds > MAX_DURATION:
        raise ValueError(f"duration {_show(value)} is over the longest accepted, 100 years "
                         f"({MAX_DURATION}s); give a duration such as 90m, 6h or 2d")
    return int(seconds)


def format_size(n: int) -> str:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            v = n / factor
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def format_duration(s: int | float) -> str:
    s = int(s)
    parts = []
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= factor:
            parts.append(f"{s // factor}{unit}")
            s %= factor
    if s or not parts:
        parts.append(f"{s}s")
    return "".join(parts)


def relative(seconds: float) -> str:
    """A time `seconds` from now: "in 2h" ahead, "2h ago" past."""
    return (f"in {format_duration(seconds)}" if seconds > 0
            else f"{format_duration(-seconds)} ago")


def exact_size(n: int) -> str:
    """A size as a spec stores it: the largest unit that holds it whole (48GB stays
    48GB), so reading it back gives the same bytes; format_size is for people."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("TB", 10**12), ("GB", 10**9),
                         ("MiB", 2**20), ("MB", 10**6), ("KiB", 2**10), ("KB", 10**3)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


Size = Annotated[int, BeforeValidator(parse_size), PlainSerializer(exact_size, return_type=str)]
Duration = Annotated[int, BeforeValidator(parse_duration),
                     PlainSerializer(format_duration, return_type=str)]


_WHEN = "such as 2026-12-05T06:00:00Z (UTC) or 2026-12-05T07:00:00+01:00"


def parse_deadline(value: object) -> datetime:
    """An aware datetime from one, or from an ISO 8601 string with its time zone: a
    deadline without a zone would mean another time on every host that reads it. A date
    alone (`2026-12-06`, or a datetime.date) is refused saying what to write."""
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            return parse_deadline(date.fromisoformat(text))
        try:
            value = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise ValueError(f"{_show(value)} is not a date and time; write one with its time "
                             f"zone, {_WHEN}") from None
    if isinstance(value, date) and not isinstance(value, datetime):
        day = value.isoformat()
        raise ValueError(f"{day} is a date without a time; write a full time with its zone, "
                         f"such as {day}T00:00:00Z (midnight UTC) or {day}T00:00:00+01:00")
    if not isinstance(value, datetime):
        raise ValueError(f"{_show(value)} is not a date and time; write one with its time "
                         f"zone, {_WHEN}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{value.isoformat()} has no time zone; add one, e.g. "
                         f"{value.isoformat()}Z (UTC) or {value.isoformat()}+01:00")
    return value


# A deadline: an aware datetime (an ISO 8601 string in files and the API)
Deadline = Annotated[datetime, BeforeValidator(parse_deadline)]
