"""Job arrays in a job spec, as Slurm's `--array`: `array: "0-99%8"` or `{range: "0-99",
max_running: 8}`. Indexes are whole numbers written as Slurm takes them: `0-99`, `1-7:2`
(a step), `0,4,9-12`, and `%N` at the end for at most N elements admitted or running at
once. The service makes one job per index (service/arrays.py)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .fielderrors import shown
from .newspecs import submit_now

MAX_ELEMENTS = 10_000        # elements of one array (Slurm's MaxArraySize is 1001)
MAX_INDEX = 1_000_000_000    # the largest index (an index is no count: it may be large)
MAX_TEXT = 10_000            # characters in a range
_ENTRY = re.compile(r"^(\d{1,10})(?:-(\d{1,10})(?::(\d{1,10}))?)?$")
EXAMPLES = "0-99, 1-7:2 or 0,4,9-12, and %N for at most N running at once"


def split_limit(text: str) -> tuple[str, int | None]:
    """`0-99%8` -> ("0-99", 8); ValueError for a `%` without a whole number of 1 or more."""
    indexes, pct, limit = text.partition("%")
    if not pct:
        return text, None
    if not limit.isdigit() or int(limit) < 1 or len(limit) > 6:
        raise ValueError(f"%{limit} is no limit: %N needs a whole number N of 1 or more "
                         "(at most N elements admitted or running at once), as in 0-99%8")
    if not indexes.strip():
        raise ValueError(f"%{limit} needs indexes before it; write e.g. 0-99%{limit}")
    return indexes, int(limit)


def _entries(text: str) -> list[tuple[int, int, int]]:
    """(first, last, step) per comma-separated entry, counted before any is expanded."""
    out = []
    for entry in text.split(","):
        m = _ENTRY.match(entry.strip())
        if not m:
            shown = entry.strip() or "an empty entry"
            raise ValueError(f"{shown!s} is no index range; write indexes such as {EXAMPLES}")
        first = int(m[1])
        last = int(m[2]) if m[2] is not None else first
        step = int(m[3]) if m[3] is not None else 1
        if last < first:
            raise ValueError(f"{entry.strip()} runs backwards ({first} to {last}); write "
                             f"{last}-{first}")
        if step < 1:
            raise ValueError(f"{entry.strip()}: a step of 0 never moves on; write a step of 1 "
                             "or more, as in 1-7:2")
        if last > MAX_INDEX:
            raise ValueError(f"index {last} is over the largest an array may use "
                             f"({MAX_INDEX}); number its elements from 0")
        out.append((first, last, step))
    return out


def parse_indexes(text: str) -> list[int]:
    """The sorted distinct indexes of a range (no `%N`); ValueError naming what is wrong.
    At most MAX_ELEMENTS, counted from the entries first, so a range of a million costs
    nothing."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"{len(text)} characters, over the most a range may have "
                         f"({MAX_TEXT}); use ranges such as 0-99 instead of lists")
    entries = _entries(text)
    count = sum((last - first) // step + 1 for first, last, step in entries)
    if count > MAX_ELEMENTS:
        raise ValueError(f"makes {count} elements, over the most an array may have "
                         f"({MAX_ELEMENTS}); split it into arrays of at most "
                         f"{MAX_ELEMENTS} elements")
    return sorted({i for first, last, step in entries for i in range(first, last + 1, step)})


def each_once(text: str, given: str) -> None:
    """A new spec gives each index once (`0,0,0` or `0-9,5-15` is a slip: Slurm would
    quietly make fewer elements than written); a stored one may repeat (newspecs.py).
    `given`: the range as written (with its %N)."""
    entries = _entries(text)
    seen: set[int] = set()
    for first, last, step in entries:
        for i in range(first, last + 1, step):
            if i in seen:
                indexes = parse_indexes(text)
                raise ValueError(f"index {i} is given more than once in {shown(given)}; "
                                 f"give each index once, e.g. {format_indexes(indexes)} "
                                 f"({len(indexes)} element{'s' if len(indexes) > 1 else ''})")
            seen.add(i)


def format_indexes(indexes: list[int], max_running: int | None = None) -> str:
    """Indexes written compactly, as squeue shows an array's pending elements: runs with a
    common step as `first-last` (`:step` when it is not 1), others by themselves, then
    `%N` (e.g. `5-99%8`, `1-7:2`, `0,4,9-12`)."""
    out, i, xs = [], 0, sorted(indexes)
    while i < len(xs):
        j = i
        step = xs[i + 1] - xs[i] if i + 1 < len(xs) else 1
        while j + 1 < len(xs) and xs[j + 1] - xs[j] == step:
            j += 1
        if j - i >= (1 if step == 1 else 2):
            out.append(f"{xs[i]}-{xs[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            out.append(str(xs[i]))
            i += 1
    return ",".join(out) + (f"%{max_running}" if max_running else "")


class ArraySpec(BaseModel):
    """One job per index; with max_running at most that many admitted or running."""

    model_config = ConfigDict(extra="forbid")

    range: str = Field(max_length=MAX_TEXT + 8, description=
                       f"indexes as Slurm's --array takes them: {EXAMPLES} "
                       f"(at most {MAX_ELEMENTS} elements)")
    max_running: int | None = Field(None, ge=1, le=MAX_ELEMENTS, description=
                                    "at most this many elements admitted or running at "
                                    "once (Slurm's %N); the others wait, JobArrayTaskLimit")

    @model_validator(mode="before")
    @classmethod
    def _text(cls, v):
        """`array: "0-99%8"` is `{range: "0-99%8"}`; `array: 7` one element."""
        if isinstance(v, int) and not isinstance(v, bool):
            return {"range": str(v)}
        return {"range": v} if isinstance(v, str) else v

    @field_validator("range")
    @classmethod
    def _indexes(cls, v: str) -> str:
        indexes, _ = split_limit(v.strip())
        parse_indexes(indexes)
        if submit_now() is not None:
            each_once(indexes, v.strip())
        return v.strip()

    @model_validator(mode="after")
    def _limit(self) -> ArraySpec:
        indexes, limit = split_limit(self.range)
        if limit is not None:
            if self.max_running is not None and self.max_running != limit:
                raise ValueError(f"range: {self.range} says %{limit} and max_running says "
                                 f"{self.max_running}; give the limit once")
            self.range, self.max_running = indexes, limit
        return self

    @property
    def indexes(self) -> list[int]:
        return parse_indexes(self.range)
