"""The scheduling pass: the one decision path that `plan`, `simulate` and the service share.

A driver submits jobs, tells the scheduler when jobs finish, and calls
`schedule(now)`; the scheduler commits what starts onto its `ClusterState` and
returns the pass's decisions. See docs/architecture.md ("The scheduling pass").
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field

from ..engine.countfit import place_by_count
from ..engine.placement import Placed, never_fits, place
from ..engine.state import ClusterState, tier_of
from ..errors import InputError
from ..jobclasses import resolve, stop_grace
from ..jobspec import JobSpec
from ..plugins import Registry, default_registry
from .config import FairShare, PolicyConfig
from .jobqueue import JobQueue, QueuedJob
from .passplan import PassPlan
from .pending import Pending, Reasons, locality_wait, quota_wait
from .reservations import Reservation, earliest_end, place_best
from .timemodel import LocalityModel


def over_quota(config: PolicyConfig, team: str, gpus: int) -> str | None:
    """Why a job of `gpus` GPUs can never start for `team`, if its quota is smaller."""
    quota = config.quota(team)
    if quota is not None and gpus > quota:
        return (f"needs {gpus} GPUs but team {team!r} has quota_gpus {quota}; "
                "raise the team's quota or shrink the job")
    return None


def planned_runtime(spec: JobSpec, config: PolicyConfig) -> float:
    """The runtime a job is planned with on one host: its spec's (with its job class
    applied), else the policy's default; never more than its time limit."""
    return float(min(spec.expected_runtime or config.default_runtime,
                     spec.time_limit or math.inf))


class Rejected(InputError):
    """The job can never run on this cluster under this policy."""

    def __init__(self, job: str, reason: str):
        super().__init__(f"job {job!r}: {reason}")
        self.reason = reason


@dataclass
class PassResult:
    now: float
    started: list[tuple[QueuedJob, Placed]] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    pending: dict[str, Pending] = field(default_factory=dict)   # filled when explaining
    tested: int = 0
    # job -> (the time its limit was cut to, the job whose reservation starts then)
    cut: dict[str, tuple[float, str]] = field(default_factory=dict)


class Scheduler:
    def __init__(self, state: ClusterState, config: PolicyConfig | None = None,
                 reg: Registry | None = None, now: float = 0.0,
                 timemodel: LocalityModel | None = None):
        self.state = state
        self.config = config or PolicyConfig()
        self.reg = reg or default_registry()
        # the job-size factor and the wait guarantee belong to `backfill`; `fifo` and
        # `count` keep the plain order (priority, age, fair share)
        self.queue = JobQueue(self.config.age_weight, self.config.size_weight
                              if self.config.mode == "backfill" else 0.0)
        self.fairshare = FairShare(self.config, now)
        self.timemodel = timemodel or LocalityModel(self.config.locality_slowdown,
                                                    self.config.learn_slowdown)
        self.running: dict[str, QueuedJob] = {}
        self.held: dict[str, int] = {}          # GPUs held per team
        # protected job -> the earliest start its reservations promised: what backfilled
        # jobs' limits are cut to, so that none can delay it beyond its grace
        self.promised: dict[str, float] = {}
        self._seq = 0
        self._empty = state.empty_like()
        self._never: dict[tuple, str | None] = {}
        self._best_tier: dict[tuple, int] = {}
        # the last pass's reservations: the state epoch they were planned in, those the
        # pass made in the order it made them (see _Pass.reserve), all that stood, and
        # whether it began with reservations carried over
        self.reuse_reservations = True
        self._planned: tuple[tuple, list[Reservation], list[Reservation], bool] = (
            (), [], [], False)

    # -- what drivers call -----------------------------------------------------------------
    def submit(self, spec: JobSpec, now: float, runtime: float | None = None) -> QueuedJob:
        """Queue a job; raises Rejected if it can never run (naming why), InputError for
        an unknown job class."""
        spec = resolve(spec, self.reg.job_classes, defaults=self.config.defaults)
        if spec.name in self.queue or spec.name in self.running:
            raise InputError(f"job {spec.name!r}: name: a job of that name is already queued "
                             "or running; job names must be unique")
        job = self._make(spec, now, runtime)
        why = self.rejection(job)
        if why:
            raise Rejected(spec.name, why)
        self.queue.add(job)
        return job

    def restore(self, spec: JobSpec, allocations, start: float,
                runtime: float | None = None, deadline: float | None = None) -> None:
        """A job that already holds resources (a driver rebuilding from its store);
        `deadline`: when it is stopped, if it was cut (else start + its time limit)."""
        self._start(self._make(resolve(spec, self.reg.job_classes,
                                       defaults=self.config.defaults), start, runtime),
                    allocations, start, deadline)

    def _make(self, spec: JobSpec, submit: float, runtime: float | None) -> QueuedJob:
        """A resolved spec as a queue entry; the runtime defaults to the spec's (or its
        class's), else the policy's."""
        jc = self.reg.job_classes.get(spec.job_class or "")
        if runtime is None:
            runtime = planned_runtime(spec, self.config)
        limit = float(spec.time_limit or math.inf)
        job = self.queue.make(spec, submit, self._seq, min(float(runtime), limit),
                              jc.priority_weight if jc else 0)
        job.limit = limit
        job.grace = float(stop_grace(spec, self.reg.job_classes, self.config.defaults))
        self._seq += 1
        return job

    def rejection(self, job: QueuedJob) -> str | None:
        why = over_quota(self.config, job.team, job.gpus)
        if why:
            return why
        if self.config.mode == "count":
            total = self.state.cluster.total_gpus
            return None if job.gpus <= total else (
                f"needs {job.gpus} GPUs, the cluster has {total}")
        if job.shape not in self._never:
            self._never[job.shape] = never_fits(job.spec, self._empty, self.reg, job.needs)
        return self._never[job.shape]

    def best_tier(self, job: QueuedJob) -> int:
        """The narrowest slowdown tier the job can ever have (on the empty cluster)."""
        if job.shape not in self._best_tier:
            got = place(job.spec, self._empty, self.reg, job.needs)
            self._best_tier[job.shape] = got.tier if isinstance(got, Placed) else 0
        return self._best_tier[job.shape]

    def runtime(self, job: QueuedJob, tier: int) -> float:
        """The job's expected runtime on a placement of `tier`."""
        return self.timemodel.runtime(job.runtime, job.job_class, tier)

    def finish(self, name: str, now: float, completed: bool = False) -> None:
        """The job ended (or was cancelled): its resources return. `completed`: it ran to
        its natural end, so its runtime teaches the time model."""
        self.promised.pop(name, None)
        if name in self.queue:
            self.queue.remove(name)
            if any(r.job.name == name for r in self._planned[2]):
                self.state.epoch += 1    # its reservation is gone: others may move up
            return
        job = self.running.pop(name)
        self.state.hard_end.pop(name, None)
        if now != self.state.expected_end[name]:
            # earlier than planned, or later (overdue): then earlier than re-estimated
            self.state.epoch += 1
        if completed:
            self.timemodel.observe(job.job_class, tier_of(self.state.allocations[name]),
                                   job.runtime, now - self.state.started[name])
        self.state.release(name)
        self.held[job.team] -= job.gpus
        self.fairshare.add(job.team, -job.gpus, now)

    # -- the pass ----------------------------------------------------------------------
    def schedule(self, now: float, explain: bool = False) -> PassResult:
        cfg = self.config
        self.fairshare.advance(now)
        fs = self.fairshare.factors(self.queue.teams)
        p = _Pass(self, now, explain)
        try:
            for job, protected in self.queue.ordered(
                    fs, p.protect_before, None if explain else p.hopeless):
                if p.result.tested >= cfg.max_jobs_tested:
                    if not explain:
                        break
                    p.wait(job, Pending("Priority", f"not tested this pass: "
                                        f"{cfg.max_jobs_tested} jobs of higher priority were "
                                        "(max_jobs_tested)"))
                    continue
                p.result.tested += 1
                p.protect_left -= protected
                p.consider(job, protected)
                if p.done():
                    break
        finally:
            p.plan.hold_first(0)
        for job, _ in p.result.started:
            self.queue.remove(job.name)
            self.promised.pop(job.name, None)
        p.result.reservations = p.reservations
        self._planned = (self.plan_epoch(), p.plan.made, p.reservations, p.plan.had_carried)
        return p.result

    def plan_epoch(self) -> tuple[int, int]:
        """Changes whenever plans made before may be wrong: resources came back earlier
        than planned, or the time model changed its factors."""
        return self.state.epoch, self.timemodel.version

    def deadline(self, name: str) -> float:
        """When a running job is stopped (SIGTERM): start + its time limit, or earlier
        where backfill cut it (inf: never)."""
        return self.state.hard_end.get(name, math.inf) - self.running[name].grace

    def _start(self, job: QueuedJob, allocations, now: float,
               deadline: float | None = None) -> None:
        """Start `job`; it is stopped at `deadline` (default: now + its time limit), and
        gone by then + its grace, which planned ends never pass."""
        if deadline is None:
            deadline = now + job.limit
        hard_end = deadline + job.grace
        end = min(now + self.runtime(job, tier_of(allocations)), hard_end)
        if hard_end < math.inf:
            self.state.hard_end[job.name] = hard_end
        self.state.commit(job.name, allocations, now, end)
        self.running[job.name] = job
        self.held[job.team] = self.held.get(job.team, 0) + job.gpus
        self.fairshare.add(job.team, job.gpus, now)


class _Pass:
    """The working memory of one pass."""

    def __init__(self, sched: Scheduler, now: float, explain: bool):
        self.s, self.now, self.explain = sched, now, explain
        self.mode = sched.config.mode
        self.result = PassResult(now)
        self.plan = PassPlan(sched, now)
        # backfill protects the oldest job of each band that has waited reserve_after
        backfill = self.mode == "backfill"
        self.protect_before = now - sched.config.reserve_after if backfill else -math.inf
        self.protect_left = sched.queue.protected(self.protect_before) if backfill else 0
        self.failed: set[tuple] = set()                # (shape, holds) known not to fit
        self.hopeless: set[tuple] = set()              # shapes that fail even without holds
        self._failures = self._failures_seen = 0       # failures counted, and when done() ran
        self.head: QueuedJob | None = None             # fifo: the first job that waits
        self.reasons = Reasons(self) if explain else None

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
        if self.protect_left > 0 and self.may_reserve():
            return False
        if self.s.state.usable_total == 0 and not self.s.queue.cpu_only:
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
            self.failed.clear()
        if job.shape in self.hopeless and not self.explain and not (
                protected and self.may_reserve()):
            return   # fails even without holds, and it gets no reservation
        quota = s.config.quota(job.team)
        if quota is not None and s.held.get(job.team, 0) + job.gpus > quota:
            return self.wait(job, quota_wait(job, quota, s.held.get(job.team, 0)))
        if self.head is not None:  # fifo: nothing starts behind the first job that waits
            return self.wait(job, Pending(
                "Priority", f"waits behind {self.head.name!r} (policy fifo: no job starts "
                "ahead of a higher-priority one)", {"behind": self.head.name}))
        if self.mode == "count":
            got = place_by_count(job.name, job.gpus, s.state)
            if got is not None:
                return self.start(job, got)
            self.hopeless.add(job.shape)
            self._failures += 1
            return self.wait(job, Pending("Resources", f"needs {job.gpus} GPUs; "
                                          f"{s.state.usable_total} are free (policy count)"))
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
                self.add(better)
                return self.wait(job, locality_wait(job, right_now, better, self.now))
        if got is not None:
            return self.start(job, got)
        if self.mode == "fifo":
            self.head = job
        reserved = None
        if (self.explain if self.mode == "fifo" else protected and self.may_reserve()):
            reserved = self.reserve(job)
            if reserved is not None and self.mode == "backfill":
                reserved = self.keep_promise(reserved)
                self.add(reserved)
        if self.explain:
            self.plan.hold_first(0)
            self.wait(job, self.reasons.blocked(job, protected, reserved))

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
        self.failed.clear()            # the holds' positions moved

    def reserve(self, job: QueuedJob, candidate: Reservation | None = None
                ) -> Reservation | None:
        """The job's reservation: the last pass's if it still stands (and ends before
        `candidate`), else a new walk for the earliest expected end."""
        r = self.plan.still_standing(job, self.result.started)
        if r is not None and (candidate is None or r.end < candidate.end):
            return r
        s = self.s
        self.plan.hold_first(0)
        return earliest_end(job, s.state, s.reg, self.now, self.reservations,
                            lambda tier: s.runtime(job, tier), s.best_tier(job), candidate,
                            start_by=s.promised.get(job.name, math.inf) + job.grace)

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
        self.plan.hold_first(k)
        got = place_best(job, self.s.state, self.s.reg, best_tier)
        if got is None:
            self.failed.add(key)
            self._failures += 1
            if k == 0 or not self.reservations:
                self.hopeless.add(job.shape)
        return got

    def start(self, job: QueuedJob, placed: Placed) -> None:
        """Start the job. Backfilled onto resources a reservation holds from a later
        time, it is planned to end before then; that is enforced: its time limit is cut
        to the reservation's start (Slurm's --time-min), so the reserved job waits at most
        the grace for it, whatever the job declared."""
        cut, by = min(((r.start, r.job.name) for r in self.reservations if r.job is not job
                       and r.start > self.now and r.overlaps(placed.allocations)),
                      default=(math.inf, ""))
        deadline = min(self.now + job.limit, cut)
        self.s._start(job, placed.allocations, self.now, deadline)
        self.result.started.append((job, placed))
        if cut < self.now + job.limit:
            self.result.cut[job.name] = (cut, by)

    def wait(self, job: QueuedJob, why: Pending) -> None:
        if self.explain:
            self.result.pending[job.name] = why
