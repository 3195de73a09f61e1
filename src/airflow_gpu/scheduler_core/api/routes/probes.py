"""Health, readiness, liveness and the Prometheus metrics (open to anyone, except /healthz
and /metrics under --protect-metrics: service/probes.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...service import health, probes
from ..bodies import DecodedOffLoop
from ..deps import Bearer, Svc, probe_reader

router = APIRouter(route_class=DecodedOffLoop)


@router.get("/healthz", dependencies=[Depends(probe_reader)])
def healthz(request: Request) -> dict:
    """Who schedules, when the last pass completed, and why passes fail if they do."""
    return health.report(request.app.state.loop)


@router.get("/livez")
async def livez() -> dict:
    """Liveness: the process serves HTTP. Never touches the database (a liveness probe
    must not restart replicas because the database is down or full)."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request, cred: Bearer, service: Svc) -> JSONResponse:
    """Readiness: a write to the database commits, and the leader's passes complete
    (503 with Retry-After and the problems when not; the problems only to callers
    that may read /healthz). Open to anyone: orchestrators' probes send no token."""
    from ...service.quarantine import ready_detail

    state = request.app.state
    ok, body = health.readiness(state.loop, service)
    body["quarantined"] = ready_detail(service)   # a detail; still ready
    if ok != state.ready:              # logged when it changes, not every probe
        state.ready = ok
        if ok:
            health.log.info("ready again")
        else:
            health.log.warning("not ready: %s", "; ".join(body["problems"]))
    shown = probes.ready_body(body, probes.check(request, cred) is None)
    return JSONResponse(shown, status_code=200 if ok else 503,
                        headers=None if ok else {"Retry-After": str(health.RETRY_AFTER)})


@router.get("/metrics", response_class=PlainTextResponse,
            dependencies=[Depends(probe_reader)])
def prometheus(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
