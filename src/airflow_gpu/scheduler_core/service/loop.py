"""The scheduling loop: run a pass on a short interval, and at once after submits and
finishes (a burst of them gathers into one pass); check the jobs' leases and deliver
webhook notifications on threads of their own, which no pass delays (leases.py,
webhooks.py). With PostgreSQL, the replicas of one deployment elect one scheduler
(leadership.py): only the leader runs passes, lease checks and deliveries."""

from __future__ import annotations

import logging
import threading
import time

from . import heap, leases
from .core import Service
from .health import Failures
from .leadership import Leadership, NotLeader, application_name, lease_seconds
from .webhooks import Deliveries

log = logging.getLogger(__name__)


class SchedulerLoop(Leadership):
    COALESCE = 0.2           # seconds a burst gathers before its pass (loop._next)
    MAX_COALESCE = 0.5
    FREED_COALESCE = 0.02    # ... when a job ended meanwhile (half a pass, at most MAX)
    # A pass woken by a finish or a submit admits without working out why every other
    # job waits, when that takes long (a long queue): freed GPUs are given at once, and
    # the reasons are brought up to date by a pass at most EXPLAIN_EVERY seconds later.
    EXPLAIN_EVERY = 2.0
    QUICK_AFTER = 0.05       # seconds an explained pass takes before woken ones skip it
    def __init__(self, service: Service, metrics=None, interval: float | None = None):
        self.service = service
        self.metrics = metrics
        self.interval = interval or service.settings.pass_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_conn = None
        self._lock_engine = None
        self.leader = False
        self.last_pass = 0.0     # seconds the last pass took
        self.passes = 0          # passes this replica completed
        self.last_pass_at: float | None = None    # when the last pass completed (epoch s)
        self.failures = Failures(log)             # what failed since it last succeeded
        self.started_at: float | None = None
        name = service.settings.deployment
        # what the lock is for: "deployment NAME", else "schema NAME" (known on first try)
        self.deployment: str | None = f"deployment {name}" if name else None
        self.lock_key: int | None = None
        self.lock_pid: int | None = None          # this replica's lock backend, leading
        self.holder: dict | None = None           # the lock's backend, another replica's
        self._holder_seen = False
        self.app_name = application_name()
        self._warned_at: float | None = None      # when the quiet-passes warning was logged
        self.lease = lease_seconds(service.settings, self.interval, self.MAX_COALESCE)
        self.token: int | None = None             # the fencing token, while leading
        self.has_lock = False                     # leading with the advisory lock too
        self._elected = False                     # took part in an election: passes fence
        service.leader_fence = self.fence         # run_pass calls it (storepass.py)
        service.leader_keep = self.kept           # and this while it decides
        # lease checks run on threads of their own, apart from passes (leases.py)
        self.lease_checks = leases.LeaseChecks(self)
        # webhook deliveries too, by the leader (webhooks.py)
        self.deliveries = Deliveries(service, self.leads, self.fence, metrics)
        self._helpers: list[threading.Thread] = []
        self._woken = False          # the next pass was woken (loop._next)
        self._explained_at = 0.0     # when the last explained pass began (monotonic)
        self._explain_took = 0.0     # and how long it took
        self._last_at = 0.0          # when the last pass began

    @property
    def last_error(self) -> dict | None:
        return self.failures.last

    def start(self) -> None:
        self.started_at = time.time()
        self.service.scheduling = True      # passes come by themselves (leaderview.py)
        heap.keep_walks_short()         # a running server's heap (tests tick by hand)
        self._thread = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)
        self._helpers = [*self.lease_checks.threads(self._stop, self.check_leases,
                                                    self._lease_check_failed),
                         *self.deliveries.threads(self._stop)]
        for t in (self._thread, *self._helpers):
            t.start()

    def stop(self) -> None:
        self.service.scheduling = False
        self._stop.set()
        self.service.wake.set()
        self.service.notified.set()
        for t in (self._thread, *self._helpers):
            if t:
                t.join(timeout=10)
        self.deliveries.close()
        self._give_up()

    def _run(self) -> None:
        while not self._stop.is_set():
            during = "election"
            try:
                if self._lead():
                    self._succeeded("election")
                    during = "pass"
                    self._pass()
                else:                  # a follower's check succeeded: its old errors are
                    self._succeeded("election", "pass", "lease check")   # no news
                    self.service.warm = None     # leading again, it reads the store anew
            except NotLeader as exc:   # taken over: stop at once, write nothing
                log.warning("%s: %s", self.deployment, exc)
                self._release()
            except Exception as exc:   # a bad pass must not stop the loop; the next retries
                self.failed(exc, during)
                self._release()
            from .health import warning

            self.note_quiet(warning(self))
            self._next()

    def _next(self) -> None:
        """Wait for the next pass. Woken from idle (a finish, a submit), it runs at once:
        freed GPUs go to the next job within one pass. Wakes that came while the last pass
        ran mean a burst is arriving: gather it into one pass, longer while passes take
        longer (twice the last), so passes never crowd out the API; when a job ended
        meanwhile, half the last pass, so its GPUs go on sooner."""
        if self.service.wake.is_set():
            gather = (max(self.FREED_COALESCE, self.last_pass / 2) if self.service.wake.freed
                      else max(self.COALESCE, 2 * self.last_pass))
            self._stop.wait(min(self.MAX_COALESCE, gather))
        else:
            wait = self.interval
            if self._explained_at < self._last_at:      # reasons left as they were
                wait = min(wait, self._explained_at + self.EXPLAIN_EVERY - time.monotonic())
            self.service.wake.wait(max(0.0, wait))
        self._woken = self.service.wake.is_set()
        self.service.wake.clear()     # before the pass: a wake during it is seen after

    def tick(self) -> list[str]:
        """A lease check, then an explained pass (run by hand: tests, tools); returns the
        admitted."""
        self.check_leases()
        return self._pass(explain=True)

    def leads(self) -> bool:
        """Whether this replica schedules now (on PostgreSQL: holds the lease's token)."""
        return self.leader and (not self._elected or self.token is not None)

    def deliver(self) -> None:
        """Deliver the webhook notifications due now (run by hand: tests, tools)."""
        self.deliveries.once()

    def check_leases(self) -> list[str]:
        """One lease check (leases.py), by the leader only; returns the jobs it ended."""
        ended = self.lease_checks.once()
        self._succeeded("lease check")
        return ended

    def _lease_check_failed(self, exc: Exception) -> None:
        if not isinstance(exc, NotLeader):      # taken over: the loop's next round steps down
            self.failed(exc, "lease check")

    def _pass(self, explain: bool | None = None) -> list[str]:
        from .metrics import queue_waits

        t0 = time.perf_counter()
        self._last_at = start = time.monotonic()
        if explain is None:
            explain = (not self._woken or self._explain_took < self.QUICK_AFTER
                       or start - self._explained_at >= self.EXPLAIN_EVERY)
        admitted = self.service.schedule_pass(explain)
        self.service.changes.bump()           # requests waiting on jobs look again
        heap.thaw_now_and_then()              # (heap.py: short garbage collections)
        self.last_pass = time.perf_counter() - t0
        if explain:
            self._explained_at, self._explain_took = start, self.last_pass
        self.last_pass_at = time.time()
        self.passes += 1
        self._succeeded("pass", "election")
        if self.metrics:
            self.metrics.pass_seconds.observe(self.last_pass)
            phases = self.service.pass_phases
            for phase, seconds in phases.seconds.items() if phases else ():
                self.metrics.pass_phase_seconds.labels(phase).observe(seconds)
            self.metrics.admissions.inc(len(admitted))
            for kind in self.service.pass_errors:    # one job or team it got past
                self.metrics.pass_errors.labels(kind).inc()
            for reason in self.service.preemptions:
                self.metrics.preemptions.labels(reason).inc()
            for reason in self.service.rebuilt:      # the state read anew (warm.py)
                self.metrics.state_rebuilds.labels(reason).inc()
            for wait in queue_waits(self.service, admitted):
                self.metrics.queue_wait.observe(wait)
        return admitted

    def failed(self, exc: Exception, during: str = "pass") -> None:
        """A pass, the leader election or a lease check raised: /healthz says what and
        when, and the log (health.Failures)."""
        self.failures.failed(exc, during, self.deployment or "scheduler")
        if self.metrics:
            self.metrics.pass_errors.labels("pass").inc()

    def _succeeded(self, *kinds: str) -> None:
        self.failures.succeeded(*kinds)

    def note_quiet(self, warning: str | None, every: float = 60.0) -> None:
        """Log /healthz's warning that passes have stopped: when it starts, then at most
        every `every` seconds while it lasts, and once when passes complete again."""
        if warning is None:
            if self._warned_at is not None:
                self._warned_at = None
                log.info("%s: scheduling passes complete again", self.deployment
                         or "scheduler")
            return
        now = time.time()
        if self._warned_at is None or now - self._warned_at >= every:
            self._warned_at = now
            log.warning("%s: %s", self.deployment or "scheduler", warning)
