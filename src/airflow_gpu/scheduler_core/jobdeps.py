"""Dependencies between jobs in a job spec, as Slurm's `--dependency`: `depends_on:
"afterok:prep:7c1e,afterany:sweep"` or `[{afterok: [prep, 7c1e]}, {afterany: sweep}]`.
Every condition must hold (Slurm's `,`); a job named in one is a reference the service
resolves (an id, an id prefix, a name, an array, `NAME_3` for one element of an array).
The service keeps the job pending until they hold (service/dependencies.py)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

KINDS = ("afterok", "afterany", "afternotok")
MAX_REFS = 100             # jobs named in one job's conditions, all together
REF = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"         # a job id, prefix, name or NAME_3
_ELEMENT = re.compile(r"^(?P<array>.+)_(?P<index>\d{1,10})$")
FORMS = ("afterok:JOB[:JOB...] (also afterany, afternotok), several joined by commas, "
         "e.g. afterok:prep,afterany:7c1e")


def _refs(kind: str, text: str) -> list[str]:
    refs = text.split(":")
    if not text or any(not r for r in refs):
        raise ValueError(f"{kind}:{text} names no job{' after a colon' if text else ''}; "
                         f"write {FORMS}")
    return refs


def parse_dependency(text: str) -> list[dict]:
    """Slurm's dependency string -> [{"kind": ..., "jobs": [...]}, ...]."""
    if "?" in text:
        raise ValueError(f"{text}: '?' (any one of the conditions) is not supported; every "
                         "condition must hold: join them with commas")
    out = []
    for cond in text.split(","):
        kind, colon, rest = cond.strip().partition(":")
        if kind not in KINDS:
            shown = kind or "an empty condition"
            raise ValueError(f"{shown} is no dependency kind; use afterok, afterany or "
                             f"afternotok (Slurm's after, aftercorr and singleton are not "
                             f"supported): {FORMS}")
        if not colon:
            raise ValueError(f"{kind} names no job; write {FORMS}")
        out.append({"kind": kind, "jobs": _refs(kind, rest.strip())})
    return out


def _normalize(v):
    """The string, a list of `{KIND: [JOB, ...]}` (or `{KIND: JOB}`) or of strings, or the
    stored form `{kind: KIND, jobs: [...]}`, as a list of the stored form."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        return v                       # the list's own check says what it got
    out = []
    for item in v:
        if isinstance(item, str):
            out += parse_dependency(item)
        elif isinstance(item, dict) and len(item) == 1 and next(iter(item)) in KINDS:
            kind, jobs = next(iter(item.items()))
            if isinstance(jobs, str):
                jobs = _refs(kind, jobs)
            out.append({"kind": kind, "jobs": jobs})
        elif isinstance(item, dict) and "kind" not in item and "jobs" not in item:
            keys = ", ".join(map(str, item)) or "nothing"
            raise ValueError(f"a condition names one kind ({', '.join(KINDS)}) and its jobs, "
                             f"e.g. {{afterok: [prep]}}; got {keys}")
        else:
            out.append(item)
    # counted where they are a list: `{afterok: 5}` is left to the model to name
    total = sum(len(c["jobs"]) for c in out
                if isinstance(c, dict) and isinstance(c.get("jobs"), list | tuple))
    if total > MAX_REFS:
        raise ValueError(f"{total} jobs named, over the most a job may wait for "
                         f"({MAX_REFS}); name an array instead of its elements, or chain "
                         "the jobs")
    return out


class Dependency(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["afterok", "afterany", "afternotok"] = Field(
        description="afterok: once each job succeeded (never, if one fails); afterany: once "
        "each ended; afternotok: once each ended without success (never, if one succeeds)")
    jobs: list[Annotated[str, Field(min_length=1, max_length=220, pattern=REF)]] = Field(
        min_length=1, max_length=MAX_REFS, description="job references: ids, id prefixes, "
        "names; an array means every element, NAME_3 one element")


DependsOn = Annotated[list[Dependency], BeforeValidator(_normalize)]


def element_ref(ref: str) -> tuple[str, int] | None:
    """`sweep_3` -> ("sweep", 3): element 3 of the array `sweep` (if it is one)."""
    m = _ELEMENT.match(ref)
    return (m["array"], int(m["index"])) if m else None


def file_target(ref: str, arrays: dict[str, list[int] | None]) -> tuple[str, int | None] | None:
    """Which job of the same file `ref` names: (its name, the element's index or None), or
    None for a job outside the file. `arrays`: each job of the file -> its array's indexes
    (None: no array). A name of the file comes before any other job of that name (a
    job's own name names an earlier job of that name: its callers skip it)."""
    if ref in arrays:
        return ref, None
    element = element_ref(ref)
    if element and arrays.get(element[0]) is not None:
        return element
    return None


def file_cycle(jobs) -> tuple[int, str] | None:
    """A cycle among the jobs of one file (JobSpecs): (the index of its first job, what
    to say), or None. A job's own name names an earlier job of that name, not itself."""
    arrays = {j.name: j.array.indexes if j.array else None for j in jobs}
    edges = {j.name: [t[0] for d in j.depends_on or () for r in d.jobs
                      if (t := file_target(r, arrays)) and t[0] != j.name] for j in jobs}
    found = cycle(edges)
    if found is None:
        return None
    at = next(i for i, j in enumerate(jobs) if j.name == found[0])
    return at, (f"the jobs {', '.join(found[:-1])} wait for each other "
                f"({' -> '.join(found)}), so none could ever start; remove one of these "
                "dependencies")


def cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """A cycle among the jobs of a file (name -> the names it waits for), as the path
    a -> b -> a, or None. Iterative: a file may chain a thousand jobs."""
    done: set[str] = set()
    for root in edges:
        if root in done:
            continue
        path, on_path = [root], {root}
        stack = [iter(edges.get(root, ()))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(edges.get(nxt, ())))
    return None
