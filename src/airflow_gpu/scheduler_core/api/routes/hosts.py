"""Hosts: drain and resume (admins), and the node agents' registration and reports."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Path, Response

from ..bodies import DecodedOffLoop
from ..deps import HostAgent, Svc, Who
from ..models.base import NAME
from ..models.hosts import DrainRequest, GpuOut, HostOut, HostRegistration, HostReport

router = APIRouter(route_class=DecodedOffLoop)
reports = APIRouter(route_class=DecodedOffLoop)     # tried before the others (app.py)


@router.post("/api/v1/hosts/{name}/drain", response_model=HostOut)
def drain(name: str, p: Who, service: Svc, body: DrainRequest | None = None):
    row = service.set_drained(name, True, p, body.reason if body else None)
    return HostOut(name=row.name, drained=row.drained, drain_reason=row.drain_reason)


@router.post("/api/v1/hosts/{name}/resume", response_model=HostOut)
def resume(name: str, p: Who, service: Svc):
    row = service.set_drained(name, False, p)
    return HostOut(name=row.name, drained=row.drained)


@router.put("/api/v1/hosts/{name}")
def register(name: Annotated[str, Path(pattern=NAME, max_length=200)],
             body: HostRegistration, p: HostAgent, service: Svc) -> dict:
    """A node agent registers its host's model (the host's agent token, or an admin
    token); answers the host's entry of the cluster view."""
    return service.register_host(name, p, body.topology,
                                 body.model_dump(exclude={"topology"}))


@router.delete("/api/v1/hosts/{name}", status_code=204)
def forget(name: Annotated[str, Path(pattern=NAME, max_length=200)], p: Who,
           service: Svc):
    """Remove the node agent's registration of a host (admins)."""
    service.forget_host(name, p)
    return Response(status_code=204)


@reports.post("/api/v1/hosts/{name}/report", response_model=list[GpuOut])
def report(name: str, body: HostReport, p: HostAgent, service: Svc):
    """The host's heartbeat: its GPUs' health and utilization (the host's agent token,
    or an admin token)."""
    rows = service.report_gpus(name, p, [g.model_dump(exclude_unset=True)
                                         for g in body.gpus])
    # the answer written here, as FastAPI would write list[GpuOut], which it would
    # otherwise build and check again
    return Response(json.dumps([{"index": g.index, "name": g.name, "healthy": g.healthy,
                                 "health_reason": g.health_reason} for g in rows],
                               ensure_ascii=False, separators=(",", ":")),
                    media_type="application/json")
