"""User-facing input errors: one message naming the file, the field and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .fielderrors import field_message


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
    """Every field's error, one message per field (fielderrors.py words them)."""
    lines, seen = [], set()
    for err in exc.errors():
        where = _loc(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            where = _loc(tuple(err["loc"])[:-1])
            name = str(err["loc"][-1])
            known = _field_names(model, tuple(err["loc"]))
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            name = name if len(name) <= 60 else f"{name[:57]}..."
            lines.append(f"{where}: unknown field '{name}'{hint} (known fields: "
                         f"{', '.join(known)})")
            continue
        if where not in seen:        # a union's members each report the same field
            seen.add(where)
            lines.append(f"{where}: {field_message(err)}")
    return "; ".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping giving the same key twice (PyYAML keeps the
    last one silently, so a repeated `gpus:` would quietly override the first)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue              # `<<: *base` overrides on purpose
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:         # an unhashable key: construct_mapping says so
                    continue
                if first is not None:
                    raise DuplicateKey(key, line, first)
                seen[key] = line
        return super().construct_mapping(node, deep)


# Dates and times stay the text they were written as (as in YAML 1.2 and JSON): each field
# parses its own (a deadline: units.parse_deadline), so a file means what the API would,
# `deadline: 2026-12-06` is told what to write, and what is sent is JSON.
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


class DuplicateKey(Exception):
    """A key given twice in one mapping (line numbers from 1)."""

    def __init__(self, key: Any, line: int, first: int):
        self.key, self.line, self.first = key, line, first


def utf8_text(data: bytes, source: str) -> str:
    """`data` as text, or an InputError naming the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); save it as UTF-8", source) from None


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError("file not found; check the path", str(path)) from None
    except IsADirectoryError:
        raise InputError("is a folder, not a file; give the path of a YAML or JSON file",
                         str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror}", str(path)) from None
    text = utf8_text(data, str(path))
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except DuplicateKey as dup:
        key = repr(dup.key) if len(repr(dup.key)) <= 60 else f"{repr(dup.key)[:57]}..."
        raise InputError(f"line {dup.line}: key {key} appears twice (first on line "
                         f"{dup.first}); keep one of them", str(path)) from None
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
