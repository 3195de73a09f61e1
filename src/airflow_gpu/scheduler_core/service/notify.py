"""Who is notified of what: a job's `notify` (its spec) and its team's webhook (set by an
admin), each with the events it asked for; the URL allow-list (the policy's
`notifications.allowed_urls`) and the sender's parser (webhookurl.py) checked when a job
is submitted or a team set; and the outbox: every job event written with `event()` that
someone asked for becomes one notification row per URL, in the transaction of the event
(`write_outbox`, run as the session commits). webhooks.py delivers them.

A team's secret signs its jobs' notifications; it is shown once, when an admin creates
or rotates it (`webhook_secret: new`), and never again: not in answers, events or logs."""

from __future__ import annotations

import json
import secrets
import uuid

from sqlalchemy import event as sa_event
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ..airflowkey import task_instance
from ..errors import InputError
from ..jobspec import DEFAULT_NOTIFY, NOTIFY_EVENTS, JobSpec, notify_events, web_url
from ..store.models import EventRow, JobRow, NotificationRow, WebhookRow
from .common import OUTBOX, utcnow

VERSION = 1               # of the body; a receiver checks it before reading the rest
WOKEN = "airflow_gpu.notified"   # session.info: the commit wrote notifications
CHUNK = 500               # job ids per IN (...) of one read
SECRET_PREFIX = "whsec_"


def refused_url(svc, field: str, url: str) -> str | None:
    """Why the service would not POST to `url` (None: it would): one line naming the
    field, the URL and the setting to change."""
    try:
        web_url(url)
    except ValueError as exc:
        return f"{field}: {exc}"
    allowed = svc._policy().notifications
    if allowed.allows(url):
        return None
    shown = ", ".join(allowed.allowed_urls[:5]) + (
        " ..." if len(allowed.allowed_urls) > 5 else "")
    return (f"{field}: {url[:200]!r} is not an allowed webhook URL: the service only POSTs "
            "to URLs that start with one of the policy file's notifications.allowed_urls ("
            + (shown or "none: webhooks are off") + "); use such a URL, or have an admin "
            "add its prefix there")


def check_job(svc, spec: JobSpec, team: str) -> None:
    """A submitted job's `notify`: an allowed URL, and a team secret to sign with."""
    if spec.notify is None:
        return
    why = refused_url(svc, "notify.url", spec.notify.url)
    if why:
        raise InputError(why)
    with svc.reads() as s:
        secret = s.scalar(select(WebhookRow.secret).where(WebhookRow.team == team))
    if secret is None:
        raise InputError(f"notify.url: team {team!r} has no webhook secret to sign its "
                         "notifications with; an admin creates one (airflow-gpu team-set "
                         f"{team} --webhook-secret new), then submit again")


def job_column(spec: JobSpec) -> dict | None:
    """What jobs.notify holds: the URL and the events, defaults filled in."""
    return spec.notify.model_dump(mode="json") if spec.notify is not None else None


# -- a team's webhook ----------------------------------------------------------------------
def set_webhook(svc, s: Session, team: str, changes: dict) -> tuple[WebhookRow, str | None]:
    """Apply an admin's webhook changes to a team: `url` (None: none), `events` (None:
    end, failure), `secret` ("new": create or rotate it). Returns the team's webhook and
    the new secret (shown once), else None. A URL needs a secret, one made before or in
    the same change."""
    row = s.get(WebhookRow, team) or WebhookRow(team=team)
    secret = None
    if changes.get("secret") is not None:
        if changes["secret"] != "new":
            raise InputError("webhook_secret: only 'new' is accepted (the service makes "
                             "the secret and shows it once); use --webhook-secret new")
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        row.secret, row.secret_at = secret, utcnow()
    if "events" in changes:
        try:
            events = changes["events"]
            row.events = None if events is None else notify_events(list(events))
        except ValueError as exc:
            raise InputError(f"webhook_events: {exc}") from None
        bad = [e for e in row.events or () if e not in NOTIFY_EVENTS]
        if bad:
            raise InputError(f"webhook_events: {bad[0]!r} is no event to notify of; use "
                             + ", ".join(NOTIFY_EVENTS))
    if "url" in changes:
        url = changes["url"] or None
        why = url and refused_url(svc, "webhook_url", url)
        if why:
            raise InputError(why)
        row.url = url
    if row.url and row.secret is None:
        raise InputError(f"webhook_url: team {team!r} has no webhook secret to sign with; "
                         f"create one in the same change (airflow-gpu team-set {team} "
                         "--webhook URL --webhook-secret new)")
    s.add(row)
    return row, secret


def hint(secret: str | None) -> str | None:
    """How lists tell secrets apart without showing them: the prefix and the last 4."""
    return None if secret is None else f"{SECRET_PREFIX}...{secret[-4:]}"


def webhook_view(row: WebhookRow | None) -> dict:
    """A team's webhook as answers show it (no secret)."""
    if row is None:
        return {"webhook_url": None, "webhook_events": None, "webhook_secret_hint": None,
                "webhook_secret_at": None}
    return {"webhook_url": row.url,
            "webhook_events": row.events or (list(DEFAULT_NOTIFY) if row.url else None),
            "webhook_secret_hint": hint(row.secret), "webhook_secret_at": row.secret_at}


def webhooks(svc) -> dict[str, WebhookRow]:
    with svc.reads() as s:
        return {r.team: r for r in s.scalars(select(WebhookRow))}


# -- the outbox ----------------------------------------------------------------------------
_JOB = (JobRow.id, JobRow.name, JobRow.team, JobRow.user, JobRow.array_id,
        JobRow.array_index, JobRow.state, JobRow.notify, JobRow.attempt, JobRow.exit_code,
        JobRow.reason, JobRow.preempt_reason, JobRow.requeue_reason, JobRow.idempotency_key)


def write_outbox(session: Session) -> None:
    """Before a commit: the notifications of the job events `event()` wrote in it, one
    row per event and URL that asked for it, in the same transaction. Columns are read
    afresh (the session's objects may be stale after bulk updates)."""
    asked = session.info.pop(OUTBOX, None)
    if not asked:
        return
    session.flush()                          # the events' ids
    ids = list({ev.job_id for ev, _, _ in asked})
    jobs = {}
    for i in range(0, len(ids), CHUNK):
        jobs.update((r.id, r) for r in session.execute(
            select(*_JOB).where(JobRow.id.in_(ids[i:i + CHUNK]))))
    hooks = {t.team: t for t in session.execute(
        select(WebhookRow.team, WebhookRow.url, WebhookRow.events)
        .where(WebhookRow.url.is_not(None)))}
    now, rows = utcnow(), []
    for ev, topics, always in asked:
        job = jobs.get(ev.job_id)
        if job is None:
            continue
        for url, source, wanted in subscribers(job, hooks.get(job.team)):
            kind = next((t for t in topics if always or t in wanted), None)
            if kind is None:
                continue
            delivery = str(uuid.uuid4())
            rows.append(dict(delivery_id=delivery, event_id=ev.id, job_id=job.id,
                             team=job.team, url=url, kind=kind,
                             source="policy" if always and kind not in wanted else source,
                             body=body(ev, kind, job, delivery), state="pending",
                             attempts=0, created_at=now, next_attempt_at=now))
    if rows:
        session.execute(insert(NotificationRow), rows)
        session.info[WOKEN] = True


def watch(sessions, woken) -> None:
    """Write the outbox as each transaction of `sessions` commits, and set `woken` (the
    delivery thread's wake-up) once it has committed notifications."""
    def committed(session: Session) -> None:
        if session.info.pop(WOKEN, False):
            woken.set()

    def rolled_back(session: Session) -> None:
        session.info.pop(OUTBOX, None)
        session.info.pop(WOKEN, None)

    sa_event.listen(sessions, "before_commit", write_outbox)
    sa_event.listen(sessions, "after_commit", committed)
    sa_event.listen(sessions, "after_rollback", rolled_back)


def subscribers(job, team) -> list[tuple[str, str, tuple[str, ...]]]:
    """(url, who asked, its events) for a job: its own notify, then its team's webhook;
    a URL once (the job's own events where both name it)."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    if job.notify:
        out[job.notify["url"]] = ("job", tuple(job.notify.get("events") or DEFAULT_NOTIFY))
    if team is not None and team.url not in out:
        out[team.url] = ("team", tuple(team.events or DEFAULT_NOTIFY))
    return [(url, source, events) for url, (source, events) in out.items()]


def body(ev: EventRow, kind: str, job, delivery: str) -> str:
    """The JSON POSTed (docs/notifications.md, "The body"): stored as sent and signed."""
    reason = job.preempt_reason if job.state == "preempting" else job.reason
    return json.dumps({
        "version": VERSION, "delivery_id": delivery, "event_id": ev.id, "kind": kind,
        "event": ev.kind, "at": ev.at.isoformat(), "message": ev.message,
        "job": {"id": job.id, "name": job.name, "team": job.team, "user": job.user,
                "array_id": job.array_id, "array_index": job.array_index,
                "state": job.state,
                "attempt": job.attempt or 0, "exit_code": job.exit_code, "reason": reason,
                "requeue_reason": job.requeue_reason,
                "links": {"api": f"/api/v1/jobs/{job.id}",
                          "airflow": task_instance(job.idempotency_key)}},
    }, separators=(",", ":"))


# -- reads ---------------------------------------------------------------------------------
def of_job(svc, job_id: str, limit: int = 200) -> list[NotificationRow]:
    """A job's notifications, oldest first: its last `limit` (explain shows them)."""
    with svc.reads() as s:
        rows = list(s.scalars(select(NotificationRow).where(
            NotificationRow.job_id == job_id).order_by(NotificationRow.id.desc())
            .limit(limit)))
    return rows[::-1]


def undelivered(svc, state: str | None = None, limit: int = 1000) -> list[NotificationRow]:
    """Notifications not delivered (pending, given up, or one of them), oldest first."""
    states = (state,) if state else ("pending", "given_up")
    with svc.reads() as s:
        return list(s.scalars(select(NotificationRow).where(
            NotificationRow.state.in_(states)).order_by(NotificationRow.id).limit(limit)))
