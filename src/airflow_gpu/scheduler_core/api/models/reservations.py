"""The bodies of the reservation routes (admins' reservations of whole hosts)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ...units import Duration
from .base import NAME, RequestBody

WHEN = ("an ISO 8601 time (2026-12-24T06:00, UTC unless it names a zone), now, or "
        "now+DURATION (now+1h)")


class ReservationRequest(RequestBody):
    name: str = Field(pattern=NAME, max_length=200)
    start: str = Field("now", max_length=100, description=f"when it starts: {WHEN}")
    end: str | None = Field(None, max_length=100, description=f"when it ends: {WHEN} "
                            "(or give duration)")
    duration: Duration | None = Field(None, description="how long it lasts, e.g. 4h (or "
                                      "give end)")
    hosts: list[str] | str | None = Field(None, description="host names or ranges "
                                          "(dgx-a-[01-04]); or give gpus")
    gpus: int | None = Field(None, ge=1, le=1_000_000, description="GPUs to reserve, as "
                             "the fewest whole hosts that hold them (or give hosts)")
    gpu_model: str | None = Field(None, max_length=200, description="with gpus: hosts "
                                  "whose GPU name contains this (A100, H100)")
    teams: list[str] = Field([], max_length=100, description="the teams whose jobs may "
                             "run in it (`reservation: NAME` in their spec)")
    maint: bool = Field(False, description="maintenance: for no team; its hosts drain at "
                        "its start and resume at its end")


class ReservationUpdate(RequestBody):
    start: str | None = Field(None, max_length=100, description=WHEN)
    end: str | None = Field(None, max_length=100, description=WHEN)
    duration: Duration | None = None
    hosts: list[str] | str | None = None
    teams: list[str] | None = Field(None, max_length=100)


class ReservationOut(BaseModel):
    name: str
    state: str = Field(description="upcoming | active | ended")
    maint: bool
    hosts: list[str]
    teams: list[str]
    start: str
    end: str
    duration_s: int
    gpus: int | None = Field(None, description="the GPU count it was asked with, if any")
    gpu_model: str | None = None
    created_by: str
    created_at: str
    drained: list[str] = Field([], description="hosts its start drained (resumed at its "
                               "end)")


class ConflictOut(BaseModel):
    id: str
    name: str
    team: str
    array_index: int | None = Field(None, description="an array element's index (its "
                                    "name then reads NAME_3, as queue shows it)")
    state: str
    expected_end: str | None = Field(description="by its expected runtime (null: none)")
    deadline: str | None = Field(description="its time limit (null: none)")


class ReservationMade(ReservationOut):
    stops: list[ConflictOut] = Field([], description="running jobs on its hosts expected "
                                     "to run past its start: each is stopped then and "
                                     "requeued under the same id, and told so")
