"""Admins' reservations of whole hosts for a window of time (Slurm's `scontrol
create/update/delete reservation`, Grid Engine's qrsub/qrdel); everyone may read them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from ..bodies import DecodedOffLoop
from ..deps import Svc, Who
from ..models.base import NAME
from ..models.reservations import (
    ReservationMade,
    ReservationOut,
    ReservationRequest,
    ReservationUpdate,
)

router = APIRouter(route_class=DecodedOffLoop)
Name = Annotated[str, Path(pattern=NAME, max_length=200)]


@router.get("/api/v1/reservations", response_model=list[ReservationOut])
def listing(_: Who, service: Svc, all: bool = False):
    """Those that have not ended (with `all`, the ended ones too), by start."""
    return service.reservations(include_ended=all)


@router.get("/api/v1/reservations/{name}", response_model=ReservationOut)
def one(name: Name, _: Who, service: Svc):
    return service.reservation(name)


@router.post("/api/v1/reservations", response_model=ReservationMade, status_code=201)
def create(body: ReservationRequest, p: Who, service: Svc):
    made, stops = service.create_reservation(p, **_fields(body))
    return {**made, "stops": stops}


@router.patch("/api/v1/reservations/{name}", response_model=ReservationMade)
def update(name: Name, body: ReservationUpdate, p: Who, service: Svc):
    made, stops = service.update_reservation(p, name, **_fields(body))
    return {**made, "stops": stops}


@router.delete("/api/v1/reservations/{name}", response_model=ReservationOut)
def delete(name: Name, p: Who, service: Svc):
    return service.delete_reservation(p, name)


def _fields(body) -> dict:
    """The body's values as parsed (a duration in seconds, not as written)."""
    return {k: getattr(body, k) for k in type(body).model_fields}
