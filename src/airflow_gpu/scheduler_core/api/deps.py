"""What the routes share: the service, the caller's token and what it may do, the job a
path names. The token itself is checked before routing (authfirst.py); these look up the
principal it found."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..service import probes
from ..service.auth import AgentPrincipal, TokenExpired, principal_for, remembered
from ..service.common import Principal
from ..service.core import Service
from .errors import Http

PRINCIPAL = "airflow_gpu.principal"      # where authfirst.py leaves the caller in the scope

_bearer = HTTPBearer(auto_error=False)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


# The dependencies that touch no database are `async def`: FastAPI runs a plain `def` one
# in a worker thread, a trip that costs more than the check itself.
async def _service(request: Request) -> Service:
    return request.app.state.service


Svc = Annotated[Service, Depends(_service)]


def _token(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Http(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                   "(airflow-gpu token create --team T)")
    return token


def known(authorization: str | None) -> Principal | None:
    """authenticate without the database, for the event loop: the caller when this
    process looked the token up less than auth.CACHE_SECONDS ago, else None (look it up);
    Http(401) without a bearer token or past its expiry."""
    try:
        return remembered(_token(authorization))
    except TokenExpired as exc:
        raise Http(401, str(exc)) from None


def authenticate(service: Service, authorization: str | None) -> Principal:
    """Who sends this Authorization header; Http(401) when nobody valid does."""
    token = _token(authorization)
    try:
        p = principal_for(service.reads, token)
    except TokenExpired as exc:
        raise Http(401, str(exc)) from None
    if p is None:
        raise Http(401, "unknown token (or revoked): create one with airflow-gpu token "
                   "create")
    return p


async def who(request: Request, cred: Bearer) -> Principal:
    """The caller (401 without a valid token): as found before routing, else looked up."""
    found = request.scope.get(PRINCIPAL)
    if found is not None:
        return found
    return await anyio.to_thread.run_sync(
        authenticate, request.app.state.service,
        f"Bearer {cred.credentials}" if cred is not None else None)


def probe_reader(request: Request, cred: Bearer) -> None:
    """/metrics and /healthz: a token (or an admin's) when --protect-metrics asks."""
    refused = probes.check(request, cred)
    if refused:
        raise Http(*refused)


def refuse_agent(p: Principal) -> Principal:
    """Team and admin tokens; an agent token is refused (403)."""
    if isinstance(p, AgentPrincipal):
        raise Http(403, f"this is an agent token (role agent, hosts {p.describe()}): it "
                   "may only register and report its own hosts (PUT /api/v1/hosts/{name}, "
                   "POST /api/v1/hosts/{name}/report); for jobs, teams and the cluster use "
                   "a team token (airflow-gpu token create --team T), for admin routes an "
                   "admin token (--admin)")
    return p


def agent_of(name: str, p: Principal) -> Principal:
    """The agent token of host `name` (or an admin token), which the service then lets
    register and report that host; any other agent token is refused (403)."""
    if isinstance(p, AgentPrincipal):
        if not p.serves(name):
            raise Http(403, f"this agent token (role agent) is for hosts {p.describe()}, "
                       f"not {name}: use the agent token of {name} (airflow-gpu token "
                       f"create --agent --host {name})")
        # for this host's register and report; still an agent's (agents.register)
        return replace(p, admin=True)
    return p


async def not_agent(p: Annotated[Principal, Depends(who)]) -> Principal:
    """refuse_agent, as a route's dependency."""
    return refuse_agent(p)


async def host_agent(name: str, p: Annotated[Principal, Depends(who)]) -> Principal:
    """agent_of the path's host, as a route's dependency."""
    return agent_of(name, p)


Who = Annotated[Principal, Depends(not_agent)]


def job_ref(job_id: str, request: Request, _: Who) -> str:
    """The job a path names: its id, a unique id prefix (4 characters or more) or its
    name (references.resolve_job: 404 when none, 409 naming the candidates when several)."""
    from ..service.references import resolve_job

    return resolve_job(request.app.state.service, job_id)


JobRef = Annotated[str, Depends(job_ref)]
HostAgent = Annotated[Principal, Depends(host_agent)]
