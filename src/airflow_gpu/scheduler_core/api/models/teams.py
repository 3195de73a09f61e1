"""The bodies of the team routes."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from ...policy.config import QUOTA_MAX, SHARE_RANGE, check_quota, check_share
from .base import RequestBody


class TeamRequest(RequestBody):
    share: float | None = Field(None, description="fair-share weight, "
                                f"{SHARE_RANGE[0]:g} to {SHARE_RANGE[1]:.0f}; none: the "
                                "policy file's")
    quota_gpus: int | None = Field(None, description="GPUs guaranteed to the team, 0 to "
                                   f"{QUOTA_MAX}; none: no quota")
    borrow_gpus: int | None = Field(None, description="GPUs it may hold beyond its quota "
                                    "while other teams leave them idle (0: a hard quota); "
                                    "none: the policy file's")

    @field_validator("share")
    @classmethod
    def _share(cls, v: float | None) -> float | None:
        return None if v is None else check_share(v)

    _quota = field_validator("quota_gpus", "borrow_gpus")(check_quota)


class TeamOut(BaseModel):
    name: str
    share: float
    quota_gpus: int | None = Field(description="GPUs guaranteed (none: no quota)")
    borrow_gpus: int | None = Field(None, description="GPUs it may hold beyond its quota "
                                    "on others' idle guarantees (0: hard quota; none: no "
                                    "limit, or no quota)")
    # a MIG device counts as its share of its GPU (compute slices / 7): 6/7 is 0.8571
    held_gpus: int | float = Field(description="GPUs its jobs hold, MIG devices by share")
    borrowed_gpus: int | float = Field(0, description="GPUs held beyond its guarantee: "
                                       "reclaimable")
    lent_gpus: int = Field(0, description="GPUs of its idle guarantee that other teams' "
                           "borrowed work uses now")
    error: str | None = Field(None, description="why the team's stored setting is refused "
                              "(the policy file's applies meanwhile)")
