"""The bodies of the routes that act on many jobs or hosts at once (scancel with filters,
drain and resume of host ranges)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from ...jobdeps import REF
from .base import NAME, RequestBody
from .hosts import DrainRequest
from .jobs import JobOut

Ref = Annotated[str, Field(min_length=1, max_length=220, pattern=REF)]   # a job reference


class CancelRequest(RequestBody):
    """Every filter given must hold; at least one filter or one reference."""

    jobs: list[Ref] = Field([], max_length=1000, description="job references (id, id "
                            "prefix, name; an array: every element; NAME_3: one element)")
    team: str | None = Field(None, max_length=200, pattern=NAME, description="only this "
                             "team's jobs (a team token: its own team's only, always)")
    state: Literal["pending", "admitted", "running", "preempting"] | None = Field(
        None, description="only jobs in this state (default: pending or live)")
    user: str | None = Field(None, max_length=200, pattern=NAME, description="only this "
                             "user's jobs (scancel -u)")
    name: str | None = Field(None, max_length=200, pattern=NAME, description="only jobs of "
                             "this name (an array's elements share its name)")
    submitted_before: datetime | None = Field(None, description="only jobs submitted at or "
                                              "before this (a dry run's as_of: what it "
                                              "showed, and nothing submitted since)")
    dry_run: bool = Field(False, description="answer what would be cancelled, cancel "
                          "nothing")


class JobBrief(BaseModel):
    id: str
    name: str
    team: str
    state: str
    array_id: str | None = None
    array_index: int | None = None


class CancelOut(BaseModel):
    dry_run: bool
    as_of: datetime = Field(description="when it matched: give it as submitted_before to "
                            "cancel what a dry run showed")
    count: int = Field(description="jobs matched")
    matched: list[str] = Field(description="the ids of the jobs matched, in submit order")
    cancelled: list[str] = Field(description="the ids of the jobs cancelled (none in a dry "
                                 "run)")
    jobs: list[JobBrief] = Field(description="the first jobs matched, described")


class JobsRequest(RequestBody):
    """hold, release: the jobs (an array: each element; scontrol hold ARRAY)."""

    jobs: list[Ref] = Field(min_length=1, max_length=1000, description="job references "
                            "(id, id prefix, name; an array: every element; NAME_3: one "
                            "element)")


class JobsUpdateRequest(JobsRequest):
    """update: what changes, for every job named (scontrol update jobid=ARRAY ...)."""

    priority: int | None = Field(None, ge=-1_000_000, le=1_000_000,
                                 description="the new priority (pending jobs)")
    time_limit: str | int | None = Field(None, description="the new time limit (e.g. 2h), "
                                         "as PATCH /api/v1/jobs/{id} takes it")
    max_running: int | None = Field(None, strict=True, description="arrays only: the most "
                                    "elements admitted or running at once (Slurm's "
                                    "ArrayTaskThrottle; 0: no limit)")


class ArrayBrief(BaseModel):
    id: str
    name: str
    size: int
    max_running: int | None


class JobsChangedOut(BaseModel):
    count: int = Field(description="jobs named (an array's elements)")
    matched: list[str] = Field(description="the ids of the jobs named")
    changed: list[str] = Field(description="the ids of the jobs changed; the others "
                               "were passed over (ended; a hold of a live job, ...)")
    one_job: bool = Field(description="one reference named one job (not an array): the "
                          "one-job routes' rules applied (409 for a hold of a running job)")
    jobs: list[JobOut] = Field(description="the first jobs named, as they are now")
    arrays: list[ArrayBrief] = Field([], description="the arrays whose max_running "
                                     "changed")


class HostsRequest(RequestBody):
    hosts: str = Field(min_length=1, max_length=10_000, description="host names or ranges "
                       "as cluster files write them: dgx-a-[01-04],dgx-h-05")


class HostsDrainRequest(HostsRequest, DrainRequest):
    """The hosts, and why (optional)."""


class HostsOut(BaseModel):
    hosts: list[dict] = Field(description="each host drained or resumed: name, drained, "
                              "drain_reason")
