"""The bodies of the team routes."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from ...jobspec import MAX_URL, NOTIFY_EVENTS, NotifyEvent
from ...policy.config import QUOTA_MAX, SHARE_RANGE, check_quota, check_share
from .base import RequestBody

# the webhook fields of a PUT: those sent change, the others stay
WEBHOOK_FIELDS = ("webhook_url", "webhook_events", "webhook_secret")
SHARE_FIELDS = ("share", "quota_gpus", "borrow_gpus")


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

    webhook_url: str | None = Field(None, max_length=MAX_URL, description="every job of "
                                    "the team is notified here (an allowed URL: the "
                                    "policy's notifications.allowed_urls); null: none")
    webhook_events: list[NotifyEvent] | None = Field(
        None, max_length=len(NOTIFY_EVENTS), description="what to notify of: "
        + ", ".join(NOTIFY_EVENTS) + " (null: end, failure)")
    webhook_secret: Literal["new"] | None = Field(
        None, description="new: create or rotate the secret the team's notifications "
        "are signed with; the answer holds it, this once")

    _quota = field_validator("quota_gpus", "borrow_gpus")(check_quota)

    def changes(self) -> tuple[bool, dict]:
        """Whether the shares are set (some was sent, or no webhook field: a PUT of the
        shares as before) and the webhook fields sent (url, events, secret)."""
        sent = self.model_fields_set
        webhook = {f.removeprefix("webhook_"): getattr(self, f)
                   for f in WEBHOOK_FIELDS if f in sent}
        return bool(sent & set(SHARE_FIELDS)) or not webhook, webhook


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
    reservation_gpus: int | float = Field(0, description="GPUs its jobs hold inside admins' "
                                          "reservations (not in held_gpus: no quota)")
    error: str | None = Field(None, description="why the team's stored setting is refused "
                              "(the policy file's applies meanwhile)")
    webhook_url: str | None = Field(None, description="to other teams without its path and "
                                    "query (scheme://host[:port]/…)")
    webhook_events: list[str] | None = None
    webhook_secret_hint: str | None = Field(None, description="whsec_... and the secret's "
                                            "last 4 characters (the secret is never shown "
                                            "again)")
    webhook_secret_at: datetime | None = Field(None, description="when it was made or "
                                               "last rotated")
    webhook_secret: str | None = Field(None, description="only in the answer that creates "
                                       "or rotates it")
