r"""Webhook deliveries: the outbox (notify.py) POSTed by the replica that leads, on
threads of their own, so no delivery ever holds up the API, a pass or a lease check.

One thread finds each URL's oldest pending delivery and, when it is due, hands the URL
to a sender (SENDERS threads, one URL each at a time, at most PER_TEAM of them for one
team, the teams' URLs taken in turn): deliveries to one URL go out in order, the next
only once the one before is delivered or given up, and no team's slow receivers hold up
another team's. Each attempt (connect, send, answer) ends by one deadline, the policy's
`notifications.timeout`, and reads at most a few KiB of the answer (webhookhttp.py). A
receiver that is down, too slow or answers 5xx (or 408, 429) is retried with a back-off
that doubles from `retry_first` up to `retry_max`, and given up `give_up_after` after the
event (an event on the job says so); any other answer but 2xx gives up at once
(redirects are not followed: the allow-list names where to POST), and so does a URL the
sender cannot parse (one stored before URLs were checked).

Each request is signed with its team's current secret over the URL it is sent to and the
body: `X-Airflow-GPU-Signature: t=<unix time>,v2=<hex HMAC-SHA256 of "<t>\n<url>\n<body>">`
(a body sent to one URL does not verify at another), and carries the delivery's id
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
from ..webhookurl import BadURL, parse, redact
from .common import _ts, _update, utcnow
from .leadership import NotLeader
from .webhookhttp import Sender

log = logging.getLogger(__name__)

POLL = 0.5        # seconds between looks for deliveries other replicas committed
SENDERS = 8       # URLs delivered to at once
PER_TEAM = 2      # of them for one team's URLs: the others stay free for other teams
SIGNATURE = "X-Airflow-GPU-Signature"
DELIVERY = "X-Airflow-GPU-Delivery"
EVENT = "X-Airflow-GPU-Event"
RETRIED = (408, 429)     # answers below 500 that are retried
HEADERS = {"User-Agent": "airflow-gpu-webhooks/1", "Content-Type": "application/json"}


def sign(secret: str, timestamp: int, url: str, body: bytes) -> str:
    """The signature header's value for `body` POSTed to `url` at `timestamp` (unix
    seconds): the URL is signed too, so the request verifies only where it was sent."""
    message = f"{timestamp}\n{url}\n".encode() + body
    return f"t={timestamp},v2={hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()}"


def verify(secret: str, header: str, body: bytes, url: str, tolerance: float = 300,
           now: float | None = None) -> bool:
    """What a receiver at `url` checks (docs/notifications.md shows it standalone): a v2
    signature of `url` and `body` with `secret`, made within `tolerance` seconds of
    `now`."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        t = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance:
        return False
    expected = sign(secret, t, url, body).split("v2=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v2", ""))


def in_turn(ready: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(url, team) oldest first, reordered so the teams take turns: each team's first,
    then each team's second, ..."""
    turns: dict[str, int] = {}
    keyed = []
    for i, (url, team) in enumerate(ready):
        keyed.append((turns.get(team, 0), i, url, team))
        turns[team] = turns.get(team, 0) + 1
    return [(url, team) for _, _, url, team in sorted(keyed)]


class Deliveries:
    """The leader's deliveries: `threads` gives the thread that runs them while `leads()`
    says this replica leads; `once` delivers what is due now, on the caller's thread (by
    hand: tests, tools). `fence(session)` raises NotLeader once the lead is lost."""

    def __init__(self, svc, leads: Callable[[], bool], fence: Callable, metrics=None):
        self.svc, self.leads, self.fence, self.metrics = svc, leads, fence, metrics
        self._busy: dict[str, str] = {}          # URL being delivered to: its team
        self._waiting = False                    # due URLs left for lack of a sender
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._sender: Sender | None = None

    def threads(self, stop: threading.Event) -> list[threading.Thread]:
        return [threading.Thread(target=self._run, args=(stop,), name="webhooks",
                                 daemon=True)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._sender is not None:
            self._sender.close()

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
        self._round(lambda url, team: self._drain(url, lambda: True))

    def _start(self, url: str, team: str) -> None:
        with self._lock:
            if url in self._busy:
                return
            if (len(self._busy) >= SENDERS
                    or sum(t == team for t in self._busy.values()) >= PER_TEAM):
                self._waiting = True          # started when a sender is free
                return
            self._busy[url] = team
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="webhook")
        self._pool.submit(self._drain, url, self.leads)

    def _round(self, start: Callable[[str, str], None]) -> float:
        """Start each URL whose oldest pending delivery is due, the teams in turn;
        seconds until the next one falls due (at most POLL)."""
        heads = (select(NotificationRow.url, func.min(NotificationRow.id).label("id"))
                 .where(NotificationRow.state == "pending")
                 .group_by(NotificationRow.url).subquery())
        with self.svc.reads() as s:
            due = s.execute(select(NotificationRow.id, NotificationRow.url,
                                   NotificationRow.team, NotificationRow.next_attempt_at)
                            .join(heads, NotificationRow.id == heads.c.id)).all()
        now, soonest, ready = _ts(utcnow()), POLL, []
        for _, url, team, at in sorted(due):
            left = _ts(at) - now
            if left > 0:
                soonest = min(soonest, left)
            else:
                ready.append((url, team))
        for url, team in in_turn(ready):
            start(url, team)
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
            log.warning("webhook deliveries to %s: %s", redact(url), exc)
        finally:
            with self._lock:
                self._busy.pop(url, None)
                waiting, self._waiting = self._waiting, False
            if waiting:                   # a sender is free: start what waits for one
                self.svc.notified.set()

    def _send(self) -> Sender:
        if self._sender is None:
            self._sender = Sender(HEADERS)
        return self._sender

    def _attempt(self, row: NotificationRow) -> bool:
        """One POST of `row`; True when it is done with (delivered or given up), False
        when it waits for a retry."""
        rules = self.svc._policy().notifications
        if not rules.allows(row.url):
            return self._give_up(row, "its URL is no longer allowed (the policy file's "
                                 "notifications.allowed_urls)")
        try:
            parse(row.url)
        except BadURL as exc:            # stored before URLs were checked as sent
            return self._give_up(row, f"its URL {exc.why}")
        with self.svc.reads() as s:
            secret = s.scalar(select(WebhookRow.secret).where(WebhookRow.team == row.team))
        if secret is None:
            return self._give_up(row, f"team {row.team!r} has no webhook secret to sign "
                                 "with")
        body = row.body.encode()
        headers = {SIGNATURE: sign(secret, int(time.time()), row.url, body),
                   DELIVERY: row.delivery_id, EVENT: row.kind}
        try:
            r = self._send().post(row.url, body, headers, rules.timeout)
        except httpx.TimeoutException as exc:
            return self._retry(row, f"{type(exc).__name__}: no answer within the attempt's "
                               f"{rules.timeout:g} s (notifications.timeout)", rules)
        except httpx.HTTPError as exc:
            return self._retry(row, f"{type(exc).__name__}: {exc}"[:300], rules)
        except Exception as exc:          # noqa: BLE001 - a request that cannot be made
            return self._give_up(row, f"the request could not be made: "
                                 f"{type(exc).__name__}: {exc}"[:300], tried=True)
        if 200 <= r.status < 300:
            return self._mark(row, "delivered", state="delivered", attempts=row.attempts + 1,
                              delivered_at=utcnow(), last_error=None)
        why = f"HTTP {r.status} {r.reason}".strip()
        if r.status >= 500 or r.status in RETRIED:
            return self._retry(row, why, rules)
        return self._give_up(row, f"the receiver answered {why}" + (
            " (redirects are not followed)" if 300 <= r.status < 400 else ""),
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
        # the URL redacted: events are shown to every team, and it may hold a secret
        message = (f"notification {row.kind!r} of event {row.event_id} to "
                   f"{redact(row.url)} given up: {why}")
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
