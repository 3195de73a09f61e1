"""Errors become HTTP answers here, once: the domain's (InputError 422, NotFound 404,
Forbidden 403, Conflict 409), the database's (a value it refuses 422; full, read-only or
unreachable 503; busy 503) and the API's own (Http: 401 and 403 of the token checks)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ..errors import InputError
from ..service import health, readlimit
from ..service.errors import Conflict, Forbidden, NotFound
from .bodies import invalid, safe

DOMAIN = ((InputError, 422), (NotFound, 404), (Forbidden, 403), (Conflict, 409))


def status_of(exc: Exception) -> int:
    """The status a domain error is answered with (DOMAIN)."""
    return next(status for kind, status in DOMAIN if isinstance(exc, kind))


class Http(Exception):
    """An answer of the API's own (status, detail); 401s ask for a bearer token."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def http_answer(exc: Http) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, status_code=exc.status,
                        headers={"WWW-Authenticate": "Bearer"} if exc.status == 401 else None)


def add_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, invalid)
    for exc_type, status in DOMAIN:
        app.add_exception_handler(exc_type, _handler(status))
    # e.g. a NUL character, which PostgreSQL text cannot hold: the client's input, not a fault
    app.add_exception_handler(DataError, lambda _, e: JSONResponse(
        {"detail": "a value cannot be stored: it holds a character (such as NUL) or a size "
         f"the database refuses ({str(e.orig).splitlines()[0]})"}, status_code=422))
    # a full disk or a read-only database: 503, the client may retry; anything else: 500
    app.add_exception_handler(DBAPIError, _storage)
    # every pooled connection busy for the pool's timeout: overloaded, the client may retry
    app.add_exception_handler(PoolTimeout, lambda _, e: JSONResponse(
        {"detail": "the service's database connections are all busy; retry shortly (or "
         "raise --db-pool-size within the database's max_connections)"}, status_code=503,
        headers={"Retry-After": str(health.RETRY_AFTER)}))
    app.add_exception_handler(readlimit.ReadTooLong, lambda _, e: JSONResponse(
        {"detail": str(e)}, status_code=503, headers={"Retry-After": str(health.RETRY_AFTER)}))
    app.add_exception_handler(Http, lambda _, e: http_answer(e))


def _storage(request: Request, exc: DBAPIError) -> JSONResponse:
    why = health.storage_problem(exc) or health.unavailable(exc)
    if why is None:
        raise exc                 # a fault of the service: 500, with its traceback logged
    # the database cannot store, or cannot be reached: the client may retry; one line
    health.log.warning("%s %s: 503: %s", request.method, request.url.path, why)
    return JSONResponse({"detail": why}, status_code=503,
                        headers={"Retry-After": str(health.RETRY_AFTER)})


def _handler(status: int):
    def handle(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": safe(str(exc), 4000)}, status_code=status)
    return handle
