"""The cluster view and the locality slowdown the scheduler plans with."""

from __future__ import annotations

from fastapi import APIRouter

from ..bodies import DecodedOffLoop
from ..deps import Svc, Who

router = APIRouter(route_class=DecodedOffLoop)


@router.get("/api/v1/cluster")
def cluster(_: Who, service: Svc) -> dict:
    return service.cluster_view()


@router.get("/api/v1/slowdown")
def slowdown(_: Who, service: Svc) -> dict:
    """The locality slowdown factors the scheduler plans with, per job class: the
    policy's, and what it learned from jobs that ran to their end."""
    return service.slowdown_view()
