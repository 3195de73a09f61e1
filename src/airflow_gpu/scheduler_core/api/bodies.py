"""Limits on request bodies: their size while they are read (chunked too), decoding and
validation in threads of their own (off the event loop and apart from the API's pool, so
heartbeats keep flowing), values JSON allows but the API does not, and 422s that never
echo the input."""

from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from ..fielderrors import field_message

MAX_BODY = 1 << 20          # bytes; larger request bodies get 413, chunked or not
PARSERS = 4                 # threads that decode request bodies at once (not the API's pool)
MAX_ERRORS = 20             # field errors a 422 lists
# A 413 closes the connection: the server would otherwise read (and drop) the rest of the
# body to keep the connection for a next request, as long as the client sends.
CLOSE = {"Connection": "close"}


class TooLarge(HTTPException):
    def __init__(self, received: int | None = None, declared: str | None = None):
        size = (f"of {_clip(declared, 30)} bytes" if declared is not None
                else f"of over {received} bytes")
        super().__init__(413, f"request body {size} is over the limit of {MAX_BODY} bytes "
                         "(1 MiB); send less: a job spec is a few KiB (at most 64 roles), "
                         "a host report one entry per GPU", headers=CLOSE)


class BodyLimit:
    """Counts a request body's bytes as they arrive, whether it declares a Content-Length or
    comes chunked, and answers 413 as soon as they pass the limit: no larger body is ever
    buffered or parsed, and the connection is closed rather than read to the body's end."""

    def __init__(self, app, limit: int = MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value.decode("latin-1").strip()
                if declared.isdigit() and int(declared) > self.limit:
                    await _json(413, TooLarge(declared=declared).detail, CLOSE)(
                        scope, receive, send)
                    return
        received, started = 0, False

        async def counted():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise TooLarge(received=self.limit)   # FastAPI answers it (413)
            return message

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except TooLarge as exc:          # a route that let it through: answer it here
            if started:
                raise
            await _json(413, exc.detail, CLOSE)(scope, receive, send)


def _json(status: int, detail, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


class DecodedOffLoop(APIRoute):
    """A route whose JSON body is decoded in a worker thread of a small pool of its own
    (PARSERS), and checked there for what JSON allows but the API does not: NaN, Infinity,
    numbers too large to hold (1e400) and lone surrogates, each answered 422 naming the
    field; then against the route's model there too, so an invalid body (however many its
    errors) is refused off the loop. The event loop meanwhile serves other requests (the
    launchers' heartbeats). Even a small body stays off the loop: its size does not bound
    its check (a 600-byte spec may name 100,000 hosts by ranges). FastAPI gets the model
    validated here and does not validate it again (the same instance passes as is)."""

    def get_route_handler(self):
        handle = super().get_route_handler()
        # the route's one body model, as FastAPI validates it (none: the body is not checked)
        model = self.body_field if not getattr(self, "_embed_body_fields", True) else None

        async def decode_then_handle(request: Request) -> Response:
            kind = request.headers.get("content-type")
            if request.method in ("POST", "PUT", "PATCH") and (
                    not kind or kind.split(";")[0].strip().lower().endswith(("/json", "+json"))):
                raw = await request.body()           # counted by BodyLimit as it arrives
                if raw:
                    # FastAPI takes the decoded body from here (Starlette's Request.json())
                    request._json = await asyncio.get_running_loop().run_in_executor(
                        _parsers(), _decode, raw, model)
            return await handle(request)

        return decode_then_handle


_pool: ThreadPoolExecutor | None = None


def _parsers() -> ThreadPoolExecutor:
    """The process's PARSERS threads (an executor: a third of the cost of anyio's trip)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(PARSERS, thread_name_prefix="body-parser")
    return _pool


def _decode(raw: bytes, model=None):
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{
            "type": "jsoninvalid", "loc": ("body", e.pos), "msg": f"JSON decode error: "
            f"{e.msg} at line {e.lineno} column {e.colno}; send the body as JSON",
            "input": None}]) from None
    except (ValueError, RecursionError) as e:
        raise HTTPException(400, f"the body cannot be read: {_clip(str(e), 200)}; send JSON "
                            "nested less deeply and integers of fewer digits") from None
    errors = _unfit(data)
    if not errors and model is not None:
        data, errors = model.validate(data, {}, loc=("body",))
    if errors:
        raise RequestValidationError(errors)
    return data


def _unfit(data) -> list[dict]:
    """Where the decoded body holds a non-finite number or a lone surrogate (in a value or a
    key): one error each, in one linear walk (paths are built only for what is reported)."""
    errors: list[dict] = []
    stack: list[tuple] = [(data, None)]          # (value, its path as (key, parent) links)
    while stack and len(errors) < MAX_ERRORS:
        value, link = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            shown = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            errors.append(_error("finite_number", link, f"{shown} (or a number too large to "
                                 "hold, such as 1e400) is not a number the API takes; send a "
                                 "finite number"))
        elif isinstance(value, str):
            if _surrogate(value):
                errors.append(_error("string_unicode", link, _surrogate_msg(value)))
        elif isinstance(value, dict):
            for key, item in value.items():
                if _surrogate(key):
                    errors.append(_error("string_unicode", (key, link), "the field name "
                                         + _surrogate_msg(key)))
                stack.append((item, (key, link)))
        elif isinstance(value, list):
            stack.extend((item, (i, link)) for i, item in enumerate(value))
    return errors


def _surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate_msg(text: str) -> str:
    return (f"{_clip(text)} holds a lone surrogate (a \\ud800-\\udfff escape without its "
            "pair), which is no character; send text as valid UTF-8")


def _error(kind: str, link, msg: str) -> dict:
    loc: list = []
    while link is not None:
        loc.append(link[0])
        link = link[1]
    return {"type": kind, "loc": ("body", *reversed(loc)), "msg": msg, "input": None}


def _clip(value, width: int = 60) -> str:
    """A value as an error may quote it: its repr (lone surrogates escaped), at most `width`
    characters; a list or an object only by its size."""
    if isinstance(value, dict):
        return f"an object of {len(value)} fields"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    return safe(repr(value), width)


def safe(text: str, width: int = 2000) -> str:
    """Text fit for an answer: lone surrogates escaped, at most `width` characters."""
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= width else f"{text[:width - 3]}..."


def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each field (at most MAX_ERRORS) in the words job files get, with the value
    it got cut short: never the submitted input itself (FastAPI's own handler echoes it
    whole, which made NaN and lone surrogates a 500 and a megabyte body a megabyte
    answer)."""
    errors = exc.errors()
    detail = []
    for err in errors[:MAX_ERRORS]:
        got = err.get("input")
        msg = safe(field_message(err), 500)        # the job files' words (fielderrors.py)
        detail.append({"type": err.get("type"),
                       "loc": [p if isinstance(p, int) else safe(str(p), 100)
                               for p in err.get("loc", ())],
                       "msg": msg, "input": None if got is None else _clip(got)})
    if len(errors) > MAX_ERRORS:
        detail.append({"type": "too_many_errors", "loc": ["body"], "input": None,
                       "msg": f"and {len(errors) - MAX_ERRORS} more errors; fix these first"})
    return JSONResponse({"detail": detail}, status_code=422)
