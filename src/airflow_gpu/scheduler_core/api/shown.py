"""What a reader of another team sees of webhook URLs: scheme://host[:port]/… (their path
and query may hold a secret, as Slack's do). The owner team and admins see them whole
(webhookurl.shown)."""

from __future__ import annotations

from typing import TypeVar

from ..service.common import Principal
from ..webhookurl import shown
from .models.jobs import JobOut
from .models.notifications import NotificationOut

J = TypeVar("J", bound=JobOut)


def jobs(outs: list[J], viewer: Principal) -> list[J]:
    """The jobs with their spec's notify.url as `viewer` may see it."""
    for out in outs:
        notify = out.spec.get("notify") if isinstance(out.spec, dict) else None
        if isinstance(notify, dict) and notify.get("url"):
            url = shown(notify["url"], out.team, viewer)
            if url != notify["url"]:
                out.spec = {**out.spec, "notify": {**notify, "url": url}}
    return outs


def notifications(outs: list[NotificationOut], viewer: Principal) -> list[NotificationOut]:
    for out in outs:
        out.url = shown(out.url, out.team, viewer)
    return outs


def teams(rows: list[dict], viewer: Principal) -> list[dict]:
    """Teams (service.teams()) with each webhook_url as `viewer` may see it."""
    return [{**t, "webhook_url": shown(t.get("webhook_url"), t["name"], viewer)}
            for t in rows]
