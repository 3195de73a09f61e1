"""The body of `POST /api/v1/jobs/batch`."""

from __future__ import annotations

from pydantic import Field

from ...service.batch import MAX_JOBS
from .base import RequestBody
from .jobs import SubmitRequest


class BatchSubmitRequest(RequestBody):
    jobs: list[SubmitRequest] = Field(
        min_length=1, max_length=MAX_JOBS,
        description=f"1 to {MAX_JOBS} jobs, each as POST /api/v1/jobs takes it; created "
        "all or none")
