"""The token is checked before the body: a request to a route that needs a token, sent
without one or with one that is unknown, revoked or expired, gets its 401 before a byte of
its body is read, decoded or validated (FastAPI reads and checks the body before it runs
the route's dependencies, which answered such a request 422 listing the body's fields).
So does an agent token on a route it may not use (403). The principal found is left in
the scope for the routes' dependencies (deps.who)."""

from __future__ import annotations

import inspect

import anyio
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import Match

from .deps import (
    PRINCIPAL,
    agent_of,
    authenticate,
    host_agent,
    known,
    not_agent,
    refuse_agent,
    who,
)
from .errors import Http, http_answer


def guard(route):
    """What `route` asks of the caller's token: None (nothing), deps.who (a valid token),
    deps.not_agent (no agent token) or deps.host_agent (the path's host's agent, if an
    agent's), from its dependencies at any depth."""
    if not isinstance(route, APIRoute):
        return None
    calls, stack = set(), list(route.dependant.dependencies)
    while stack:
        d = stack.pop()
        calls.add(d.call)
        stack.extend(d.dependencies)
    return next((c for c in (host_agent, not_agent, who) if c in calls), None)


def needs_token(route) -> bool:
    return guard(route) is not None


class AuthFirst:
    """Pure ASGI: finds the route a request goes to (as the router does: the first that
    matches path and method) and, when it needs a token, checks the token first."""

    def __init__(self, app):
        self.app = app
        self.guards: dict[int, object] = {}

    async def __call__(self, scope, receive, send):
        found = self._route(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        check, params = found
        header = next((v.decode("latin-1") for k, v in scope["headers"]
                       if k == b"authorization"), None)
        service = scope["app"].state.service
        try:
            # a token seen within auth.CACHE_SECONDS costs no thread: most requests
            principal = known(header) or await anyio.to_thread.run_sync(
                authenticate, service, header)
            if check is not_agent:
                refuse_agent(principal)
            elif check is host_agent:
                agent_of(params["name"], principal)
        except Http as exc:
            await http_answer(exc)(scope, receive, send)
            return
        except Exception as exc:      # e.g. the database unreachable: as the app answers it
            answer = await _handled(scope, exc)
            if answer is None:
                raise
            await answer(scope, receive, send)
            return
        scope[PRINCIPAL] = principal
        await self.app(scope, receive, send)

    def _route(self, scope):
        """(its guard, its path parameters) for the route the request goes to when that
        route needs a token; else None."""
        for route in scope["app"].router.routes:
            match, child = route.matches(scope)
            if match == Match.FULL:
                key = id(route)
                if key not in self.guards:
                    self.guards[key] = guard(route)
                check = self.guards[key]
                return None if check is None else (check, child.get("path_params", {}))
        return None


async def _handled(scope, exc: Exception):
    """The app's answer to `exc` (its exception handlers), None when it has none."""
    handlers = scope["app"].exception_handlers
    for kind in type(exc).__mro__:
        handler = handlers.get(kind)
        if handler is not None:
            answer = handler(Request(scope), exc)
            return await answer if inspect.isawaitable(answer) else answer
    return None
