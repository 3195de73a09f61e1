"""One scheduling pass's working memory and decisions: for each job in order, start it
now, reserve for it, preempt for it, or say why it waits (`Scheduler.schedule` drives
it). See docs/architecture.md ("The scheduling pass")."""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..engine.countfit import place_by_count
from ..engine.placement import Placed
from .passplan import PassPlan
from .pending import Reasons, locality_wait
from .preempt import Preemption, claimed, preempt
from .reservations import Reservation, earliest_end, place_best
from .slack import at_risk
from .types import Pending, QueuedJob
from .upcoming import upcoming
from .windows import confined, full, holders, waiting_for

if TYPE_CHECKING:
    from .types import SchedulerView


@dataclass
class PassResult:
    now: float
    started: list[tuple[QueuedJob, Placed]] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    pending: dict[str, Pending] = field(default_factory=dict)   # filled when explaining
    tested: int = 0
    # job -> (when it must be stopped: a reservation's start, the job reserved then)
    cut: dict[str, tuple[float, str]] = field(default_factory=dict)
    # job started inside an admin's reservation -> when it ends (the job is stopped then)
    until: dict[str, float] = field(default_factory=dict)
    preempted: list[Preemption] = field(default_factory=list)



class Pass:
    """The working memory of one pass."""

    def __init__(self, sched: SchedulerView, now: float, explain: bool):
        self.s, self.now, self.explain = sched, now, explain
        self.mode = sched.config.mode
        self.result = PassResult(now)
        self.plan = PassPlan(sched, now)
        # backfill protects the oldest job of each band that has waited reserve_after
        backfill = self.mode == "backfill"
        self.protect_before = sched.protect_before(now)
        self.protect_left = sched.queue.protected(self.protect_before) if backfill else 0
        # jobs whose deadline is near get a reservation too (slack.py): those yet to come
        self.urgent_before = sched.urgent_before(now)
        self.urgent_left = sched.queue.urgent(self.urgent_before)
        self.failed: set[tuple] = set()                # (shape, holds) known not to fit
        self.hopeless: set[tuple] = set()              # shapes that fail even without holds
        self._failures = self._failures_seen = 0       # failures counted, and when done() ran
        self.head: QueuedJob | None = None             # fifo: the first job that waits
        self.reasons = Reasons(self) if explain else None
        self.claimants: set[str] = set()              # considered first (see claimant)
        self.cannot_preempt: dict[tuple, float] = {}  # kinds of jobs no preemption helps
        self.victim_pool: list | None = None          # victims.pool, made when first needed
        # rules `on_deadline` look at a job's slack: job -> whether it is late (see late)
        self._late: dict[str, bool] | None = {} if any(
            r.on_deadline for r in sched.config.preemption.rules) else None
        # the walk late() made, for reserve() to reuse: (job, reservations' version, walk)
        self._walk: tuple[str, int, Reservation | None] | None = None
        self._version = 0                              # reservations added or dropped

    @property
    def reservations(self) -> list[Reservation]:
        return self.plan.reservations

    def may_reserve(self) -> bool:
        return (self.mode == "backfill"
                and len(self.reservations) < self.s.config.reservation_depth)

    def done(self) -> bool:
        """Nothing more can start or be reserved: every shape queued fails, without holds or
        with the holds its shortest job would have to go around (more holds only take)."""
        if self.explain:
            return False
        if self.mode == "fifo":
            return self.head is not None
        if (self.protect_left > 0 or self.urgent_left > 0) and self.may_reserve():
            return False
        # holds kept beyond those the pass asked for only take GPUs: none usable with them
        # must be checked without them
        if (self.s.state.usable_total == 0 and not self.s.queue.cpu_only
                and self.plan.usable_total() == 0):
            return True
        if self._failures == self._failures_seen:
            return False
        self._failures_seen = self._failures
        queue, starts = self.s.queue, self.plan.starts()
        return all(shape in self.hopeless or (shape, bisect.bisect_left(
            starts, self.now + queue.shortest(shape))) in self.failed for shape in queue.shapes)

    def consider(self, job: QueuedJob, protected: bool) -> None:
        s = self.s
        if self.plan.drop_carried(job):   # it waited for locality: it decides again
            self._version += 1
            self.failed.clear()
        if job.spec.reservation is not None:
            return self.in_window(job)
        near = job.latest_start < self.urgent_before
        self.urgent_left -= near
        urgent = near and not protected
        if job.shape in self.hopeless and not self.explain and not (
                (protected or urgent) and self.may_reserve()):
            return   # fails even without holds, and it gets no reservation
        why = s.quotas.wait(job)
        if why is not None:
            if self.mode != "count" and s.config.preemption.rules:
                why = preempt(self, job, own_team=True) or upcoming(self, job, why, True)
            else:
                why = upcoming(self, job, why, own_team=True)
            return self.wait(job, why)
        if self.head is not None:  # fifo: nothing starts behind the first job that waits
            return self.wait(job, Pending(
                "Priority", f"waits behind {self.head.name!r} (policy fifo: no job starts "
                "ahead of a higher-priority one)", {"behind": self.head.name}))
        if self.mode == "count":
            got = place_by_count(job.name, job.gpus, s.state, job.needs)
            if got is not None:
                return self.start(job, got)
            self.hopeless.add(job.shape)
            self._failures += 1
            mig = "".join(f" and {n.slices * n.replicas} MIG {n.mig} devices"
                          for n in job.needs if n.mig)
            return self.wait(job, Pending("Resources", f"needs {job.gpus} GPUs{mig}; "
                                          f"{s.state.usable_total} GPUs are free (policy "
                                          "count)"))
        got = self.plan.due_now(job) or self.try_now(job)
        if (got is not None and self.mode == "backfill" and got.tier > s.best_tier(job)
                and self.may_reserve()):
            right_now = Reservation(job, self.now, self.now + s.runtime(job, got.tier),
                                    got.allocations, got.tier)
            better = self.reserve(job, right_now)
            # waiting for a narrower placement ends earlier; a job promised a start waits
            # no longer than its promise and grace allow
            if better is not right_now and better.start <= s.promised.get(
                    job.name, math.inf) + job.grace:
                if job.name in s.promised:
                    # still a promise: what backfills in front of it is cut to the
                    # promised start, not to the later one locality waits for
                    better = self.keep_promise(better)
                self.add(better)
                return self.wait(job, locality_wait(job, right_now, better, self.now))
        if got is not None:
            return self.start(job, got)
        # reclaim needs a team with a guarantee (none: nothing to reclaim, skip the search)
        if s.config.preemption.rules or (s.config.preemption.reclaim
                                         and not s.quotas.unlimited):
            why = preempt(self, job)
            if why is not None:
                return self.wait(job, why)
        if self.mode == "fifo":
            self.head = job
        reserved = None
        if (self.explain if self.mode == "fifo" else protected and self.may_reserve()):
            reserved = self.reserve(job)
            if reserved is not None and self.mode == "backfill":
                reserved = self.keep_promise(reserved)
                self.add(reserved)
        elif urgent and self.may_reserve():
            # resources held for it as they free up, or a big job near its deadline
            # never finds them free at once; no promise: slack orders, not waits
            reserved = self.reserve(job)
            if reserved is not None:
                reserved.carry = False
                self.add(reserved)
        if self.explain:       # holds stay taken: the reasons drop them where they place
            self.plan.let_go()
            self.wait(job, upcoming(self, job, self.reasons.blocked(job, protected, reserved)))

    def in_window(self, job: QueuedJob) -> None:
        """A job that asks for an admin's reservation: it starts only there, and only if
        it is expected to end before the reservation does (quotas do not count it)."""
        s = self.s
        w = s.windows.get(job.spec.reservation)
        why = waiting_for(w, job, self.now)
        if why is not None:
            return self.wait(job, why)
        inside = dataclasses.replace(job, spec=confined(job.spec, w))
        self.plan.hold_first(0)
        got = place_best(inside, s.state, s.reg, s.best_tier(job))
        if got is None:            # full: say who holds it, not that the job is too long
            return self.wait(job, full(w, s.runtime(job, s.best_tier(job)), math.inf,
                                       self.now, holders(s.state, w)))
        end = self.now + s.runtime(job, got.tier)
        if end > w.end or self.plan.blocks(
                got.allocations, end, ignore=self.plan.windows.get(w.name)):
            return self.wait(job, full(w, s.runtime(job, s.best_tier(job)), end, self.now))
        self.start(job, got, until=w.end)

    def late(self, job: QueuedJob) -> bool:
        """Whether the job's deadline is at risk unless it preempts (rules `on_deadline`):
        its latest start is now, or it is urgent (slack under deadline_slack) and its
        earliest start without preempting (the walk its reservation would make, past the
        pass's reservations so far) is after its latest start. Once per job and pass,
        and walked only while the pass still makes reservations (reservation_depth); a
        job with more slack waits (what runs may end sooner than planned). A lost cause
        (its latest start has passed: it misses even if it started now) never preempts,
        nor does a job of a team whose deadlines the policy lets preempt no one."""
        if self._late is None or job.latest_start < self.now:
            return False
        if not self.s.config.deadline_preempts(job.team):
            return False
        if job.latest_start <= self.now:
            return True
        if job.latest_start >= self.urgent_before:
            return False
        if job.name not in self._late:
            if not self.may_reserve():
                return False                # the pass plans no further ahead
            r = self.walk(job)
            self._walk = (job.name, self._version, r)
            self._late[job.name] = r is None or r.start > job.latest_start
        return self._late[job.name]

    def keep_promise(self, r: Reservation) -> Reservation:
        """A protected reservation holds from the earliest start promised to its job: if a
        job in its way overran (within its limit and grace), nothing more may backfill onto
        its resources in front of it, so the slip cannot grow."""
        r.protected = True
        promise = min(self.s.promised.get(r.job.name, math.inf), r.planned_start)
        self.s.promised[r.job.name] = promise
        if r.start > promise:
            return dataclasses.replace(r, start=promise, eta=r.planned_start)
        return r

    def add(self, r: Reservation) -> None:
        self.plan.add(r)
        self._version += 1
        self.failed.clear()            # the holds' positions moved

    def reserve(self, job: QueuedJob, candidate: Reservation | None = None
                ) -> Reservation | None:
        """The job's reservation: the last pass's if it still stands (and ends before
        `candidate`), else a new walk for the earliest expected end."""
        r = self.plan.still_standing(job, self.result.started)
        if r is not None and (candidate is None or r.end < candidate.end):
            return r
        promised = self.s.promised.get(job.name)
        if (candidate is None and promised is None and self._walk is not None
                and self._walk[:2] == (job.name, self._version)):
            return self._walk[2]        # late() walked for it around the same reservations
        return self.walk(job, candidate, math.inf if promised is None
                         else promised + job.grace)

    def walk(self, job: QueuedJob, candidate: Reservation | None = None,
             start_by: float = math.inf) -> Reservation | None:
        """The placement with the earliest expected end around the pass's reservations
        (reservations.earliest_end, which counts them itself: none is held meanwhile)."""
        s = self.s
        self.plan.hold_first(0)
        return earliest_end(job, s.state, s.reg, self.now, self.reservations,
                            lambda tier: s.runtime(job, tier), s.best_tier(job), candidate,
                            start_by=start_by)

    def try_now(self, job: QueuedJob) -> Placed | None:
        """A placement now that touches no reservation starting before the job would end
        there (the end depends on the placement's slowdown), or None."""
        s = self.s
        best = s.best_tier(job)
        starts = self.plan.starts()
        k = bisect.bisect_left(starts, self.now + s.runtime(job, best))
        for _ in range(3):
            got = self.try_place(job, k, best)
            if got is None:
                return None
            need = bisect.bisect_left(starts, self.now + s.runtime(job, got.tier))
            if need <= k:
                return got
            k = need
        return None

    def try_place(self, job: QueuedJob, k: int, best_tier: int) -> Placed | None:
        """Place the job around the holds of the first `k` reservations, or None."""
        key = (job.shape, k)
        if key in self.failed or job.shape in self.hopeless:
            return None
        got = None
        # too few GPUs fails place_best's first test: then no hold kept is given back
        if self.plan.ask(k) >= job.gpus:
            self.plan.hold_first(k)
            got = place_best(job, self.s.state, self.s.reg, best_tier)
        if got is None:
            self.failed.add(key)
            self._failures += 1
            if k == 0 or not self.reservations:
                self.hopeless.add(job.shape)
        return got

    def start(self, job: QueuedJob, placed: Placed, until: float = math.inf) -> None:
        """Start the job. Backfilled onto resources a reservation holds from a later
        time, it is planned to end before then; that is enforced: it is stopped at the
        reservation's start (the service and the simulator requeue it), so the reserved
        job waits at most the grace for it, whatever the job declared. A job inside an
        admin's reservation is stopped at its end (`until`)."""
        cut, by = min(((r.start, r.job.name) for r in self.plan.overlapping(placed.allocations)
                       if r.job is not job and r.start > self.now), default=(math.inf, ""))
        deadline = min(self.now + job.limit, cut, until)
        job.borrowed = until == math.inf and not self.s.quotas.covered(job)
        self.s._start(job, placed.allocations, self.now, deadline)
        self.result.started.append((job, placed))
        if cut < min(self.now + job.limit, until):
            self.result.cut[job.name] = self.s.yields[job.name] = (cut, by)
        if until < self.now + job.limit:
            self.result.until[job.name] = until

    def claimant(self, name: str) -> None:
        """A job that preempted others earlier: it starts if it can, else waits for its
        victims (preempt.claimed); a claim that ended leaves it to the usual order."""
        job = self.s.queue.jobs.get(name)
        if job is None:
            self.s.claims.pop(name, None)
            return
        got = None if self.s.quotas.wait(job) else self.try_now(job)
        if got is not None:
            self.claimants.add(name)
            return self.start(job, got)
        why = claimed(self, job)
        if why is not None:
            self.claimants.add(name)
            self.wait(job, why)

    def wait(self, job: QueuedJob, why: Pending) -> None:
        if self.explain:
            self.result.pending[job.name] = at_risk(job, why, self.now)
