"""The bodies of the token routes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from ...service.auth import HOST_PATTERN
from ...units import Duration
from .base import NAME, RequestBody


class TokenCreate(RequestBody):
    team: str | None = Field(None, pattern=NAME, max_length=200, description="the team "
                             "it acts for (agent tokens: a label, default 'agents')")
    role: Literal["team", "admin", "agent"] = Field(
        "team", description="team: its team's jobs; admin: every team, hosts, quotas and "
        "tokens; agent: only register and report `hosts`")
    hosts: list[Annotated[str, Field(max_length=200, pattern=HOST_PATTERN.pattern)]] | None \
        = Field(None, min_length=1, max_length=1000, description="agent tokens: the host "
                "names or glob patterns ('dgx-*') it serves")
    allow_new_hosts: list[Annotated[str, Field(max_length=200,
                                               pattern=HOST_PATTERN.pattern)]] | None \
        = Field(None, min_length=1, max_length=1000, description="agent tokens: the host "
                "names or glob patterns of its `hosts` that it may add to the cluster; "
                "without it, it registers only hosts the cluster file lists")
    user: str | None = Field(None, pattern=NAME, max_length=200, description="a user's "
                             "token of the team (role team): its jobs are that user's, "
                             "and it changes (cancel, hold, update...) only those")
    expires_in: Duration | None = Field(None, gt=0, description="refused after this long "
                                        "(30d, 12h, seconds); default never")
    expires_at: datetime | None = Field(None, description="refused from then on (ISO 8601; "
                                        "no zone: UTC)")

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, at: datetime | None) -> datetime | None:
        if at is None:
            return None
        try:
            return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
        except (OverflowError, ValueError):
            raise ValueError("out of range; give a time within the next 100 years") from None

    @model_validator(mode="after")
    def _consistent(self) -> TokenCreate:
        if self.expires_in is not None and self.expires_at is not None:
            raise ValueError("give expires_in or expires_at, not both")
        if (self.role == "agent") != (self.hosts is not None):
            raise ValueError("hosts: agent tokens (role agent) name their hosts, and only "
                             "they")
        if self.allow_new_hosts is not None and self.role != "agent":
            raise ValueError("allow_new_hosts: only agent tokens (role agent) register "
                             "hosts; give role agent and hosts, or leave it out")
        if self.role != "agent" and not self.team:
            raise ValueError(f"team: a {self.role} token needs a team")
        if self.user is not None and self.role != "team":
            raise ValueError(f"user: only team tokens are for a user of the team, not "
                             f"{self.role} tokens; give role team, or leave user out")
        return self


class TokenOut(BaseModel):
    id: int
    team: str
    role: str
    user: str | None = Field(None, description="a user's token: the user of its team")
    hosts: list[str] | None = None
    allow_new_hosts: list[str] | None = Field(None, description="agent tokens: the hosts "
                                              "outside the cluster file it may add")
    created_at: datetime
    expires_at: datetime | None = None
    expired: bool = False
    hint: str | None = Field(None, description="the secret's last characters (agpu_...abcd), "
                             "to tell tokens apart; null for tokens made before 0009")


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: shown this once, stored only as a hash")
