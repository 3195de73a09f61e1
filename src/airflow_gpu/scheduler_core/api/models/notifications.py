"""The bodies of the notification routes: a webhook delivery and its state."""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import BaseModel, Field

from ...store.models import NotificationRow


class NotificationOut(BaseModel):
    delivery_id: str = Field(description="sent as X-Airflow-GPU-Delivery, the same on "
                             "every retry")
    event_id: int | None
    event: str | None = Field(description="the job event's kind (admitted, failed, ...)")
    kind: str = Field(description="what it notifies of: start, end, failure, preemption, "
                      "requeue, idle, reservation, deadline")
    job_id: str | None
    team: str
    url: str = Field(description="where it is POSTed; to other teams without its path "
                     "and query (scheme://host[:port]/…)")
    source: str = Field(description="who asked: job (its notify), team (its webhook), "
                        "policy (idle.action: notify)")
    state: str = Field(description="pending (retrying while attempts > 0) | delivered | "
                       "given_up")
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None = Field(description="while pending: when it is sent "
                                             "(again)")
    delivered_at: datetime | None
    last_error: str | None

    @classmethod
    def of(cls, n: NotificationRow) -> NotificationOut:
        try:
            event = json.loads(n.body).get("event")
        except (ValueError, AttributeError):
            event = None
        return cls(delivery_id=n.delivery_id, event_id=n.event_id, event=event, kind=n.kind,
                   job_id=n.job_id, team=n.team, url=n.url, source=n.source, state=n.state,
                   attempts=n.attempts, created_at=n.created_at,
                   next_attempt_at=n.next_attempt_at if n.state == "pending" else None,
                   delivered_at=n.delivered_at, last_error=n.last_error)
