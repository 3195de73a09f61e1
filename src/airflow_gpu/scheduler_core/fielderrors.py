"""One field's error as users read it, in job files, the CLI, the operators and the API's
422s alike: the value it got, what is wrong with it and what to write instead. pydantic's
own wording ("Input should be a valid string") and its regex patterns never reach a user;
our validators' messages (value_error) are already in these words and pass as they are.
"""

from __future__ import annotations

import math
import re
from datetime import date
from typing import Any

# the name pattern every model uses (job, team, user, role and reservation names)
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
NAME_RULE = "use ASCII letters, digits and . _ - (a letter or digit first)"
# other patterns a model uses, in words
_PATTERNS = {
    r"^[^\x00-\x1f\x7f]+$": "text without control characters (tab, newline, NUL); remove "
                           "them",
    r"^[A-Za-z0-9_.:/-]+$": "ASCII letters, digits and _ . : / - only",
    r"^[A-Za-z0-9*?\[][A-Za-z0-9_.*?\[\]!-]*$": "a host name or glob pattern (letters, "
                                              "digits, . _ - and * ? [ ] !)",
}
_BOUNDS = {"greater_than": ("gt", "is too small; give more than {}"),
           "greater_than_equal": ("ge", "is under the least accepted, {0}; give {0} or more"),
           "less_than": ("lt", "is too large; give less than {}"),
           "less_than_equal": ("le", "is over the most accepted, {0}; give {0} or less")}


def shown(value: Any) -> str:
    """A value as a message quotes it: JSON's and YAML's words (true, null), text in
    quotes, at most 60 characters; a list or a mapping by its size."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"   # YAML's
    if isinstance(value, dict):
        return f"a mapping of {len(value)} field{'s' * (len(value) != 1)}"
    if isinstance(value, list | tuple | set):
        return f"a list of {len(value)} item{'s' * (len(value) != 1)}"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _names(message: str, value: Any) -> bool:
    """Whether `message` already quotes `value` (as a word of its own, not inside one)."""
    if isinstance(value, dict | list | tuple | set):
        return True                   # never echoed; the field's name says which
    for text in {repr(value), str(value), shown(value)}:
        if text and re.search(rf"(?<![\w.-]){re.escape(text[:60])}", message):
            return True
    return False


def not_a_name(value: str) -> str:
    """Why `value` is no name (NAME), and the rule."""
    if value == "":
        return f"it is empty; give a name ({NAME_RULE})"
    if not re.fullmatch(r"[A-Za-z0-9]", value[0]):
        why = f"it starts with {value[0]!r}"
    else:
        c = next((c for c in value if not re.fullmatch(r"[A-Za-z0-9_.-]", c)), "?")
        why = "it holds a space" if c == " " else f"it holds {c!r}"
    return f"{shown(value)} is not a name: {why}; {NAME_RULE}"


def _kind(value: Any, field: str, wanted: str, example: str) -> str:
    """`value` is not of the kind wanted; YAML's readings of unquoted text named. `field`:
    how an example names the field ("team: ", or "" for an item of a list)."""
    if isinstance(value, bool) and wanted == "text":
        return (f"{shown(value)} is a yes/no value, not text (YAML reads an unquoted yes, "
                f"no, on, off, true or false so); write the text in quotes, such as "
                f"{field}'{'yes' if value else 'no'}'")
    if isinstance(value, int | float) and not isinstance(value, bool) and wanted == "text":
        return (f"{shown(value)} is a number, not text (YAML reads unquoted digits so, 007 "
                f"as 7); write the text in quotes, such as {field}'{value}'")
    return f"{shown(value)} is not {wanted}; write {example}"


def field_message(err: dict) -> str:
    """The message for one pydantic error (a dict of ValidationError.errors()), without
    the field's location, which the caller puts in front."""
    kind, value = err.get("type", ""), err.get("input")
    ctx = err.get("ctx") or {}
    loc = [p for p in err.get("loc", ()) if isinstance(p, str)]
    field = loc[-1] if loc else "value"
    # how an example names it: `gpus: 1`, or `1` alone for an item of a list
    named = "" if err.get("loc") and isinstance(err["loc"][-1], int) else f"{field}: "
    if kind in ("jsoninvalid", "string_unicode") or (kind == "finite_number"
                                                      and value is None):
        return str(err.get("msg", ""))          # the API's own checks (api/bodies.py)
    if kind in ("value_error", "assertion_error"):
        msg = str(ctx.get("error", "")) or err.get("msg", "").removeprefix("Value error, ")
        return msg if _names(msg, value) else f"{msg} (got {shown(value)})"
    if kind == "missing":
        return f"missing; {field} is required, add it"
    if kind == "extra_forbidden":
        return f"unknown field {shown(field)}; check its spelling, or remove it"
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"{shown(value)} {words.format(ctx.get(key))}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        if pattern == NAME and isinstance(value, str):
            return not_a_name(value)
        return f"{shown(value)} is not {_PATTERNS.get(pattern, 'in the form accepted here')}"
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return f"it is empty; give at least {least} character{'s' * (least != 1)}" \
            if value == "" else f"{shown(value)} is too short; give at least {least} characters"
    if kind == "string_too_long":
        return (f"{shown(value)} is {len(str(value))} characters, over the most accepted, "
                f"{ctx.get('max_length')}; shorten it")
    if kind == "too_short":
        least, has = ctx.get("min_length", 1), ctx.get("actual_length", 0)
        return (f"the list is empty; give at least {least} item{'s' * (least != 1)}"
                if not has else f"{has} item{'s' * (has != 1)}; give at least {least}")
    if kind == "too_long":
        return (f"{shown(value)}, over the most accepted, {ctx.get('max_length')}; give "
                "fewer")
    if kind in ("literal_error", "enum"):
        return f"{shown(value)} is not one of {ctx.get('expected')}; write one of them"
    if kind == "finite_number":
        return f"{shown(value)} is not a finite number; give a finite one"
    if kind == "string_type":
        return _kind(value, named, "text", f"{named}some-text")
    if kind.startswith("int_"):
        return _kind(value, named, "a whole number", f"one such as {named}1")
    if kind.startswith("float_"):
        return _kind(value, named, "a number", f"one such as {named}1.5")
    if kind.startswith("bool_"):
        return _kind(value, named, "true or false", f"{named}true or {named}false")
    if kind in ("list_type", "tuple_type", "set_type", "iterable_type"):
        return _kind(value, named, "a list", "a list: [a, b], or one '- item' per line")
    if kind in ("dict_type", "model_type", "model_attributes_type", "dataclass_type"):
        return _kind(value, named, "a mapping of fields",
                     "its fields as key: value lines, or {key: value, ...}")
    if kind.startswith(("datetime_", "date_", "timezone_")):
        return _kind(value, named, "a date and time with its time zone",
                     "one such as 2026-12-05T06:00:00Z")
    # a kind no model here produces today: pydantic's sentence, the value once
    msg = err.get("msg", "not accepted")
    return msg if _names(msg, value) else f"{msg} (got {shown(value)})"
