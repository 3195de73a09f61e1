"""The scheduling pass: the one decision path that `plan`, `simulate` and the service share.

A driver submits jobs, tells the scheduler when jobs finish, and calls
`schedule(now)`; the scheduler commits what starts onto its `ClusterState` and
returns the pass's decisions. See docs/architecture.md ("The scheduling pass").
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .countfit import place_by_count
from .errors import InputError
from .hosttype import bits
from .jobclasses import resolve
from .jobqueue import JobQueue, QueuedJob
from .jobspec import JobSpec
from .placement import Placed, never_fits, place
from .plugins import Registry, default_registry
from .policy import FairShare, PolicyConfig
from .reservations import Reservation, could_fit, drop_all, earliest_start, hold_all
from .state import ClusterState
from .units import format_duration


def over_quota(config: PolicyConfig, team: str, gpus: int) -> str | None:
    """Why a job of `gpus` GPUs can never start for `team`, if its quota is smaller."""
    quota = config.quota(team)
    if quota is not None and gpus > quota:
        return (f"needs {gpus} GPUs but team {team!r} has quota_gpus {quota}; "
                "raise the team's quota or shrink the job")
    return None


class Rejected(InputError):
    """The job can never run on this cluster under this policy."""

    def __init__(self, job: str, reason: str):
        super().__init__(f"job {job!r}: {reason}")
        self.reason = reason


@dataclass
class Pending:
    """Why a job waits: a code, a message with numbers, details, and an ETA if planned."""

    code: str            # Resources | Locality | Priority | Quota | Unhealthy
    message: str
    details: dict = field(default_factory=dict)
    eta: float | None = None     # seconds from the pass until the planned start

    def to_dict(self) -> dict:
        return {"code": self.code, "reason": self.message, "details": self.details,
                "eta_seconds": None if self.eta is None else round(self.eta)}


@dataclass
class PassResult:
    now: float
    started: list[tuple[QueuedJob, Placed]] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    pending: dict[str, Pending] = field(default_factory=dict)   # filled when explaining
    tested: int = 0


class Scheduler:
    def __init__(self, state: ClusterState, config: PolicyConfig | None = None,
                 reg: Registry | None = None, now: float = 0.0):
        self.state = state
        self.config = config or PolicyConfig()
        self.reg = reg or default_registry()
        self.queue = JobQueue(self.config.age_weight)
        self.fairshare = FairShare(self.config, now)
        self.running: dict[str, QueuedJob] = {}
        self.held: dict[str, int] = {}          # GPUs held per team
        self._seq = 0
        self._empty = state.empty_like()
        self._never: dict[tuple, str | None] = {}
        # the last pass's reservations, in the order they were made, and the state epoch
        # they were planned in (see _Pass.reserve)
        self.reuse_reservations = True
        self._planned: tuple[int, list[Reservation]] = (-1, [])

    # -- what drivers call -----------------------------------------------------------------
    def submit(self, spec: JobSpec, now: float, runtime: float | None = None) -> QueuedJob:
        """Queue a job; raises Rejected if it can never run (naming why), InputError for
        an unknown job class."""
        spec = resolve(spec, self.reg.job_classes)
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
                runtime: float | None = None) -> None:
        """A job that already holds resources (a driver rebuilding from its store)."""
        self._start(self._make(resolve(spec, self.reg.job_classes), start, runtime),
                    allocations, start)

    def _make(self, spec: JobSpec, submit: float, runtime: float | None) -> QueuedJob:
        """A resolved spec as a queue entry; the runtime defaults to the spec's (or its
        class's), else the policy's."""
        jc = self.reg.job_classes.get(spec.job_class or "")
        if runtime is None:
            runtime = spec.expected_runtime or self.config.default_runtime
        job = self.queue.make(spec, submit, self._seq, float(runtime),
                              jc.priority_weight if jc else 0)
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

    def finish(self, name: str, now: float) -> None:
        """The job ended (or was cancelled): its resources return."""
        if name in self.queue:
            self.queue.remove(name)
            return
        job = self.running.pop(name)
        if now < self.state.expected_end[name]:
            self.state.epoch += 1
        self.state.release(name)
        self.held[job.team] -= job.gpus
        self.fairshare.add(job.team, -job.gpus, now)

    # -- the pass ----------------------------------------------------------------------
    def schedule(self, now: float, explain: bool = False) -> PassResult:
        cfg = self.config
        self.fairshare.advance(now)
        fs = self.fairshare.factors(self.queue.teams)
        p = _Pass(self, now, explain)
        for job in self.queue.ordered(fs):
            if p.result.tested >= cfg.max_jobs_tested:
                if not explain:
                    break
                p.wait(job, Pending("Priority", f"not tested this pass: {cfg.max_jobs_tested} "
                                    "jobs of higher priority were (max_jobs_tested)"))
                continue
            p.result.tested += 1
            p.consider(job)
            if p.done():
                break
        for job, _ in p.result.started:
            self.queue.remove(job.name)
        p.result.reservations = p.reservations
        self._planned = (self.state.epoch, p.made)
        return p.result

    def _start(self, job: QueuedJob, allocations, now: float) -> None:
        self.state.commit(job.name, allocations, now, now + job.runtime)
        self.running[job.name] = job
        self.held[job.team] = self.held.get(job.team, 0) + job.gpus
        self.fairshare.add(job.team, job.gpus, now)


class _Pass:
    """The working memory of one pass."""

    def __init__(self, sched: Scheduler, now: float, explain: bool):
        self.s, self.now, self.explain = sched, now, explain
        self.mode = sched.config.mode
        self.result = PassResult(now)
        self.reservations: list[Reservation] = []      # sorted by start
        self.made: list[Reservation] = []              # in the order they were made
        epoch, last = sched._planned
        self.last = last if epoch == sched.state.epoch and sched.reuse_reservations else []
        self.failed: set[tuple] = set()                # (shape, holds) known not to fit
        self.hopeless: set[tuple] = set()              # shapes that fail even without holds
        self._hopeless_seen = 0
        self.head: QueuedJob | None = None             # fifo: the first job that waits
        self._why: dict[tuple, Pending] = {}
        self._eta: dict[tuple, float | None] = {}

    def may_reserve(self) -> bool:
        return (self.mode == "backfill"
                and len(self.reservations) < self.s.config.reservation_depth)

    def done(self) -> bool:
        """Nothing more can start or be reserved: every shape queued fails without holds."""
        if self.explain:
            return False
        if self.mode == "fifo":
            return self.head is not None
        if self.may_reserve():
            return False
        if self.s.state.usable_total == 0 and not self.s.queue.cpu_only:
            return True
        if len(self.hopeless) == self._hopeless_seen:
            return False
        self._hopeless_seen = len(self.hopeless)
        return len(self.hopeless) >= len(self.s.queue.shapes) and all(
            sh in self.hopeless for sh in self.s.queue.shapes)

    def consider(self, job: QueuedJob) -> None:
        s = self.s
        if job.shape in self.hopeless and not self.explain and not self.may_reserve():
            return   # fails even without holds, and no reservation is left to give
        quota = s.config.quota(job.team)
        if quota is not None and s.held.get(job.team, 0) + job.gpus > quota:
            self.wait(job, Pending("Quota", (
                f"team {job.team!r} holds {s.held.get(job.team, 0)} GPUs of its quota_gpus "
                f"{quota}; this job needs {job.gpus} more"),
                {"quota_gpus": quota, "held_gpus": s.held.get(job.team, 0)}))
            return
        if self.head is not None:  # fifo: nothing starts behind the first job that waits
            self.wait(job, Pending("Priority", f"waits behind {self.head.name!r} (policy fifo: "
                                   "no job starts ahead of a higher-priority one)",
                                   {"behind": self.head.name}))
            return
        if self.mode == "count":
            got = place_by_count(job.name, job.gpus, s.state)
            if got is not None:
                return self.start(job, got)
            self.hopeless.add(job.shape)
            self.wait(job, Pending("Resources", f"needs {job.gpus} GPUs; "
                                   f"{s.state.usable_total} are free (policy count)"))
            return
        k = bisect.bisect_left([r.start for r in self.reservations], self.now + job.runtime)
        got = self.try_place(job, k)
        if got is not None:
            return self.start(job, got)
        if self.mode == "fifo":
            self.head = job
        reserved = None
        if self.explain if self.mode == "fifo" else self.may_reserve():
            reserved = self.reserve(job)
            if reserved is not None and self.mode == "backfill":
                starts = [r.start for r in self.reservations]
                self.reservations.insert(bisect.bisect_right(starts, reserved.start), reserved)
                self.made.append(reserved)
                self.failed.clear()
        if self.explain:
            why = self.reason(job)
            if reserved is not None:
                why.eta = reserved.start - self.now
                why.details["reserved_hosts"] = reserved.hosts
            else:
                why.eta = self.eta(job)
            self.wait(job, why)

    def reserve(self, job: QueuedJob) -> Reservation | None:
        """The job's reservation: the last pass's if it still stands, else a new walk.

        The last pass's n-th reservation stands when its first n-1 stood too (same holds),
        it is for the same job and still ahead, nothing came back earlier than planned since
        (the state's epoch), and no job started in this pass touches it before it ends.
        Nothing else can move it: every other change only takes resources, and backfill
        only takes reserved ones until the reservation starts."""
        n = len(self.made)
        if n < len(self.last):
            r = self.last[n]
            if (r.job is job and r.start > self.now and not any(
                    self.s.state.expected_end[j.name] > r.start and r.overlaps(p.allocations)
                    for j, p in self.result.started)):
                return r
            self.last = []
        return earliest_start(job, self.s.state, self.s.reg, self.now, self.reservations)

    def try_place(self, job: QueuedJob, k: int) -> Placed | None:
        """Place the job around the holds of the first `k` reservations, or None."""
        key = (job.shape, k)
        if key in self.failed or job.shape in self.hopeless:
            return None
        state = self.s.state
        got = None
        if could_fit(job, state):
            holds = hold_all(state, self.reservations[:k])
            try:
                if could_fit(job, state):
                    placed = place(job.spec, state, self.s.reg, job.needs)
                    got = placed if isinstance(placed, Placed) else None
            finally:
                drop_all(state, holds)
        if got is None:
            self.failed.add(key)
            if k == 0 or not self.reservations:
                self.hopeless.add(job.shape)
        return got

    def start(self, job: QueuedJob, placed: Placed) -> None:
        self.s._start(job, placed.allocations, self.now)
        self.result.started.append((job, placed))

    def wait(self, job: QueuedJob, why: Pending) -> None:
        if self.explain:
            self.result.pending[job.name] = why

    # -- explaining (only when asked: plan, the service's explain) -----------------------------
    def reason(self, job: QueuedJob) -> Pending:
        """Why the job cannot start now. Jobs of one shape share the reason (not its ETA)."""
        key = (job.shape, job.runtime)
        if key in self._why:
            w = self._why[key]
            return Pending(w.code, w.message, dict(w.details))
        s = self.s
        got = place(job.spec, s.state, s.reg, job.needs)
        if isinstance(got, Placed):
            blockers = [r for r in self.reservations if r.overlaps(got.allocations)]
            r = blockers[0] if blockers else None
            if r is not None:
                msg = (f"fits now, but on resources reserved for {r.job.name!r} (priority "
                       f"{r.job.base:g}) from {format_duration(r.start - self.now)} on, "
                       f"on {', '.join(r.hosts)}; this job's expected runtime "
                       f"({format_duration(job.runtime)}) would end after that")
                why = Pending("Priority", msg, {"reservation_for": r.job.name})
            else:
                why = Pending("Priority", "fits now, but not around the reservations of "
                              "higher-priority jobs", {})
        else:
            code, msg, details = got.explain()
            why = Pending(code, msg, details)
            self._unhealthy(job, why)
        self._why[key] = why
        return Pending(why.code, why.message, dict(why.details))

    def _unhealthy(self, job: QueuedJob, why: Pending) -> None:
        state = self.s.state
        bad = [h.name for h, hs in zip(state.cluster.hosts, state.hosts, strict=True)
               if hs.drained or hs.bad_gpus]
        if not bad:
            return
        healthy = state.empty_like()
        for h in bad:
            hs = state.hosts[state.cluster.by_name[h].index]
            healthy.set_drained(h, hs.drained)
            healthy.set_unhealthy_gpus(h, bits(hs.bad_gpus))
        if never_fits(job.spec, healthy, self.s.reg, job.needs):
            why.code = "Unhealthy"
            why.message += (f"; it can only run once drained or unhealthy hosts are back "
                            f"({', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''})")
            why.details["unhealthy_hosts"] = bad

    def eta(self, job: QueuedJob) -> float | None:
        """When the job could start around this pass's reservations (not reserved itself)."""
        if self.mode == "count" or self.head not in (None, job):
            return None
        if job.shape not in self._eta:
            r = earliest_start(job, self.s.state, self.s.reg, self.now, self.reservations)
            self._eta[job.shape] = None if r is None else r.start - self.now
        return self._eta[job.shape]
