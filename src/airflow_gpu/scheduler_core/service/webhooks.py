"""Webhook deliveries: the outbox (notify.py) POSTed by the replica that leads, on
threads of their own, so no delivery ever holds up the API, a pass or a lease check.

One thread finds each URL's oldest pending delivery and, when it is due, hands the URL
to a sender (a few threads, one URL each at a time): deliveries to one URL go out in
order, the next only once the one before is delivered or given up. A receiver that is
down, times out or answers 5xx (or 408, 429) is retried with a back-off that doubles
from the policy's `notifications.retry_first` up to `retry_max`, and given up
`give_up_after` after the event (an event on the job says so); any other answer but 2xx
gives up at once (redirects are not followed: the allow-list names where to POST).

Each request is signed with its team's current secret: `X-Airflow-GPU-Signature:
t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, and carries the delivery's id
(`X-Airflow-GPU-Delivery`, the same on every retry) for receivers to deduplicate. A
delivery is marked delivered in a transaction fenced as a pass's is (a leader taken over
writes nothing); only a crash between the answer and that mark sends it twice."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
from sqlalchemy import func, select

from ..store.models import NotificationRow, WebhookRow
from ..units import format_duration
from .common import _ts, _update, utcnow
from .leadership import NotLeader

log = logging.getLogger(__name__)

POLL = 0.5        # seconds between looks for deliveries other replicas committed
SENDERS = 4       # URLs delivered to at once
SIGNATURE = "X-Airflow-GPU-Signature"
DELIVERY = "X-Airflow-GPU-Delivery"
EVENT = "X-Airflow-GPU-Event"
RETRIED = (408, 429)     # answers below 500 that are retried


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value for `body` sent at `timestamp` (unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, tolerance: float = 300,
           now: float | None = None) -> bool:
    """What a receiver checks (docs/notifications.md shows it standalone): a v1 signature
    of `body` with `secret`, made within `tolerance` seconds of `now`."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        t = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance:
        return False
    expected = sign(secret, t, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


class Deliveries:
    """The leader's deliveries: `threads` gives the thread that runs them while `leads()`
    says this replica leads; `once` delivers what is due now, on the caller's thread (by
    hand: tests, tools). `fence(session)` raises NotLeader once the lead is lost."""

    def __init__(self, svc, leads: Callable[[], bool], fence: Callable, metrics=None):
        self.svc, self.leads, self.fence, self.metrics = svc, leads, fence, metrics
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._http: httpx.Client | None = None

    def threads(self, stop: threading.Event) -> list[threading.Thread]:
        return [threading.Thread(target=self._run, args=(stop,), name="webhooks",
                                 daemon=True)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._http is not None:
            self._http.close()

    def _run(self, stop: threading.Event) -> None:
        woken = self.svc.notified
        while not stop.is_set():
            woken.clear()            # before the look: a commit during it is seen after
            wait = POLL
            try:
                if self.leads():
                    wait = self._round(self._start)
            except Exception as exc:  # noqa: BLE001 - the database may be away: look again
                log.warning("webhook deliveries: %s", exc)
            woken.wait(wait)

    def once(self) -> None:
        """Deliver what is due now, URL by URL, on this thread."""
        self._round(lambda url: self._drain(url, lambda: True))

    def _start(self, url: str) -> None:
        with self._lock:
            if url in self._busy:
                return
            self._busy.add(url)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="webhook")
        self._pool.submit(self._drain, url, self.leads)

    def _round(self, start: Callable[[str], None]) -> float:
        """Start each URL whose oldest pending delivery is due; seconds until the next
        one falls due (at most POLL)."""
        heads = (select(NotificationRow.url, func.min(NotificationRow.id).label("id"))
                 .where(NotificationRow.state == "pending")
                 .group_by(NotificationRow.url).subquery())
        with self.svc.reads() as s:
            due = s.execute(select(NotificationRow.url, NotificationRow.next_attempt_at)
                            .join(heads, NotificationRow.id == heads.c.id)).all()
        now, soonest = _ts(utcnow()), POLL
        for url, at in due:
            left = _ts(at) - now
            if left > 0:
                soonest = min(soonest, left)
            else:
                start(url)
        return max(0.01, soonest)

    def _drain(self, url: str, leads: Callable[[], bool]) -> None:
        """Deliver `url`'s pending notifications in order while they are due."""
        try:
            while leads():
                with self.svc.reads() as s:
                    row = s.scalars(select(NotificationRow).where(
                        NotificationRow.state == "pending", NotificationRow.url == url)
                        .order_by(NotificationRow.id).limit(1)).first()
                if row is None or _ts(row.next_attempt_at) > _ts(utcnow()):
                    return
                if not self._attempt(row):
                    return
        except NotLeader:
            return                        # another replica delivers from here on
        except Exception as exc:          # noqa: BLE001 - the next round tries again
            log.warning("webhook deliveries to %s: %s", url, exc)
        finally:
            with self._lock:
                self._busy.discard(url)

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(follow_redirects=False, headers={
                "User-Agent": "airflow-gpu-webhooks/1", "Content-Type": "application/json"})
        return self._http

    def _attempt(self, row: NotificationRow) -> bool:
        """One POST of `row`; True when it is done with (delivered or given up), False
        when it waits for a retry."""
        rules = self.svc._policy().notifications
        if not rules.allows(row.url):
            return self._give_up(row, "its URL is no longer allowed (the policy file's "
                                 "notifications.allowed_urls)")
        with self.svc.reads() as s:
            secret = s.scalar(select(WebhookRow.secret).where(WebhookRow.team == row.team))
        if secret is None:
            return self._give_up(row, f"team {row.team!r} has no webhook secret to sign "
                                 "with")
        body = row.body.encode()
        headers = {SIGNATURE: sign(secret, int(time.time()), body),
                   DELIVERY: row.delivery_id, EVENT: row.kind}
        try:
            r = self._client().post(row.url, content=body, headers=headers,
                                    timeout=rules.timeout)
        except httpx.HTTPError as exc:
            return self._retry(row, f"{type(exc).__name__}: {exc}"[:300], rules)
        if 200 <= r.status_code < 300:
            return self._mark(row, "delivered", state="delivered", attempts=row.attempts + 1,
                              delivered_at=utcnow(), last_error=None)
        why = f"HTTP {r.status_code} {r.reason_phrase}".strip()
        if r.status_code >= 500 or r.status_code in RETRIED:
            return self._retry(row, why, rules)
        return self._give_up(row, f"the receiver answered {why}" + (
            " (redirects are not followed)" if 300 <= r.status_code < 400 else ""),
            tried=True)

    def _retry(self, row: NotificationRow, error: str, rules) -> bool:
        now = utcnow()
        attempts = row.attempts + 1
        end = _ts(row.created_at) + rules.give_up_after
        if _ts(now) >= end:
            return self._give_up(row, f"still failing after {attempts} attempts over "
                                 f"{format_duration(_ts(now) - _ts(row.created_at))}: "
                                 f"{error}", tried=True)
        wait = min(rules.retry_max, rules.retry_first * 2 ** (attempts - 1))
        at = min(now + timedelta(seconds=wait), row.created_at + timedelta(
            seconds=rules.give_up_after))
        self._mark(row, "failed", attempts=attempts, next_attempt_at=at, last_error=error)
        return False

    def _give_up(self, row: NotificationRow, why: str, tried: bool = False) -> bool:
        message = (f"notification {row.kind!r} of event {row.event_id} to {row.url} given "
                   f"up: {why}")
        log.warning("job %s: %s", row.job_id, message)
        return self._mark(row, "given_up", said=message, state="given_up",
                          attempts=row.attempts + int(tried), last_error=why)

    def _mark(self, row: NotificationRow, outcome: str, said: str | None = None,
              **values) -> bool:
        """Write an attempt's outcome (guarded: only the attempt read is updated), with
        the event that tells a give-up; fenced, so a leader taken over writes nothing."""
        with self.svc.sessions.begin() as s:
            self.fence(s)
            done = s.execute(_update(NotificationRow).where(
                NotificationRow.id == row.id, NotificationRow.state == "pending",
                NotificationRow.attempts == row.attempts).values(**values))
            if done.rowcount == 1 and said:
                self.svc._event(s, "notification", said, job=row.job_id)
        if self.metrics:
            self.metrics.webhook_deliveries.labels(outcome).inc()
        return True
