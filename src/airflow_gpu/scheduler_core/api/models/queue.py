"""The bodies of the queue routes (Slurm's and Grid Engine's habits)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .base import RequestBody
from .jobs import JobOut


class QueueEntry(JobOut):
    rank: int | None = Field(None, description="a pending job's place in the order the "
                             "scheduler considers them (1: first); none for the others")
    band: float | None = Field(None, description="priority + job-class weight (pending)")
    score: float | None = Field(None, description="fair share + size + age points within "
                                "the band (pending; GET /api/v1/priorities)")
    eta_at: datetime | None = Field(None, description="a pending job's planned start")
    eta_s: int | None = Field(None, description="seconds until eta_at")
    elapsed_s: int | None = Field(None, description="since admission: to now while live, "
                                  "to its end once ended")
    reason: str | None = Field(None, description="why a pending job waits, the jobs it "
                               "names given by name and short id")
    array_tasks: str | None = Field(None, description="an entry for an array's elements "
                                    "waiting for their turn or a dependency: their indexes "
                                    "as squeue writes them (5-99%8); the other fields are "
                                    "the first one's")
    array_count: int | None = Field(None, description="how many elements that entry is")


class UpdateRequest(RequestBody):
    priority: int | None = Field(None, ge=-1_000_000, le=1_000_000,
                                 description="a pending job's new priority")
    time_limit: str | int | None = Field(None, description="the new time limit (e.g. 2h): "
                                         "within the job class's and the policy's maximum; "
                                         "a live job's may be raised by admins only")
