"""User-facing input errors: one message naming the file, the field and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError


class InputError(Exception):
    """Bad input a user can fix. `str()` is the whole message; no traceback is shown."""

    def __init__(self, message: str, source: str | None = None):
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Known field names of the model that holds the field at `loc` (for 'did you mean')."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        field = getattr(current, "model_fields", {}).get(part)
        current = _inner_model(field.annotation) if field else None
    return list(getattr(current, "model_fields", {}) or [])


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    for err in exc.errors():
        where = _loc(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            where = _loc(tuple(err["loc"])[:-1])
            name = str(err["loc"][-1])
            known = _field_names(model, tuple(err["loc"]))
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            lines.append(f"{where}: unknown field '{name}'{hint} (known fields: "
                         f"{', '.join(known)})")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"{where}: {msg}{shown}")
    return "; ".join(lines)


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("file not found; check the path", str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror}", str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{where}not valid YAML/JSON: {problem}", str(path)) from None


def validate(model: type[BaseModel], data: Any, source: str, context: dict | None = None):
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise InputError(describe_validation_error(exc, model), source) from None
