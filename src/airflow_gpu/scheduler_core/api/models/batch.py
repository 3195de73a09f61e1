"""The bodies of `POST /api/v1/jobs/batch` and `POST /api/v1/jobs/heartbeats`."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from ...service.batch import MAX_JOBS
from ...service.beats import MAX_BEATS
from .base import RequestBody
from .jobs import SubmitRequest


class BatchSubmitRequest(RequestBody):
    jobs: list[SubmitRequest] = Field(
        min_length=1, max_length=MAX_JOBS,
        description=f"1 to {MAX_JOBS} jobs, each as POST /api/v1/jobs takes it; created "
        "all or none")


class Beat(RequestBody):
    id: str = Field(min_length=36, max_length=36, description="the job's full id")
    attempt: int | None = Field(None, ge=1, le=2**31 - 1, description="the admission the "
                                "launcher started (as `?attempt=` of a single heartbeat)")


class HeartbeatsRequest(RequestBody):
    jobs: list[Beat] = Field(
        min_length=1, max_length=MAX_BEATS,
        description=f"1 to {MAX_BEATS} jobs whose launcher is alive")


class BeatOut(BaseModel):
    """What a launcher needs of a job after a heartbeat (a single heartbeat answers the
    whole job): its state and lease, and what it is told to do."""
    id: str
    state: str
    attempt: int
    lease_expires_at: datetime | None
    stop_grace: int | None = None
    yield_at: datetime | None = None
    yield_reservation: str | None = None
    idle_since: datetime | None = None
    idle_flagged_at: datetime | None = None
    preempted_by: str | None = None
    preempt_reason: str | None = None
    preempt_signal: str | None = None
    preempt_grace: float | None = None
    preempt_deadline_at: datetime | None = None

    @classmethod
    def of(cls, j) -> BeatOut:
        stopping = j.state == "preempting"
        return cls(id=j.id, state=j.state, attempt=j.attempt or 0,
                   lease_expires_at=j.lease_expires_at, stop_grace=j.stop_grace,
                   yield_at=j.yield_at, yield_reservation=j.yield_reservation,
                   idle_since=j.idle_since, idle_flagged_at=j.idle_flagged_at,
                   preempted_by=j.preempted_by, preempt_reason=j.preempt_reason,
                   **({"preempt_signal": j.preempt_signal, "preempt_grace": j.preempt_grace,
                       "preempt_deadline_at": j.preempt_deadline_at} if stopping else {}))


class RefusedOut(BaseModel):
    id: str
    status: int = Field(description="what a single heartbeat of it is answered: 403, 404 "
                        "or 409")
    detail: str


class HeartbeatsOut(BaseModel):
    jobs: list[BeatOut] = Field(description="the jobs whose lease was extended (or start "
                                "confirmed), as they now are")
    refused: list[RefusedOut]
