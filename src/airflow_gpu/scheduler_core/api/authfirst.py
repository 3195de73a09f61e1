"""The token is checked before the body: a request to a route that needs a token, sent
without one or with one that is unknown, revoked or expired, gets its 401 before a byte of
its body is read, decoded or validated (FastAPI reads and checks the body before it runs
the route's dependencies, which answered such a request 422 listing the body's fields).
The principal found is left in the scope for the routes' dependencies (deps.who)."""

from __future__ import annotations

import inspect

import anyio
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import Match

from .deps import PRINCIPAL, authenticate, who
from .errors import Http, http_answer


def needs_token(route) -> bool:
    """Whether `route` depends, at any depth, on a valid token (deps.who)."""
    if not isinstance(route, APIRoute):
        return False
    stack = list(route.dependant.dependencies)
    while stack:
        d = stack.pop()
        if d.call is who:
            return True
        stack.extend(d.dependencies)
    return False


class AuthFirst:
    """Pure ASGI: finds the route a request goes to (as the router does: the first that
    matches path and method) and, when it needs a token, checks the token first."""

    def __init__(self, app):
        self.app = app
        self.guarded: dict[int, bool] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._guarded(scope):
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"]
                       if k == b"authorization"), None)
        service = scope["app"].state.service
        try:
            scope[PRINCIPAL] = await anyio.to_thread.run_sync(authenticate, service, header)
        except Http as exc:
            await http_answer(exc)(scope, receive, send)
            return
        except Exception as exc:      # e.g. the database unreachable: as the app answers it
            answer = await _handled(scope, exc)
            if answer is None:
                raise
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _guarded(self, scope) -> bool:
        for route in scope["app"].router.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                key = id(route)
                if key not in self.guarded:
                    self.guarded[key] = needs_token(route)
                return self.guarded[key]
        return False


async def _handled(scope, exc: Exception):
    """The app's answer to `exc` (its exception handlers), None when it has none."""
    handlers = scope["app"].exception_handlers
    for kind in type(exc).__mro__:
        handler = handlers.get(kind)
        if handler is not None:
            answer = handler(Request(scope), exc)
            return await answer if inspect.isawaitable(answer) else answer
    return None
