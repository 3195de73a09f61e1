"""What every request body shares."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"       # team names, as in the job spec
States = Literal["pending", "admitted", "running", "preempting", "succeeded", "failed",
                 "cancelled", "lost", "timeout"]


class RequestBody(BaseModel):
    # NaN and Infinity (and 1e400, which JSON parsers read as infinity) are no numbers here
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
