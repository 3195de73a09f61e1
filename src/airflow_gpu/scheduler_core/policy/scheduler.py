"""The scheduling pass: the one decision path that `plan`, `simulate` and the service share.

A driver submits jobs, tells the scheduler when jobs finish, and calls
`schedule(now)`; the scheduler commits what starts onto its `ClusterState` and
returns the pass's decisions. See docs/architecture.md ("The scheduling pass").
"""

from __future__ import annotations

import math

from ..engine.placement import Placed, never_fits, place
from ..engine.state import ClusterState, tier_of
from ..errors import InputError
from ..jobclasses import preempt_options, resolve, stop_grace
from ..jobspec import JobSpec
from ..plugins import Registry, default_registry
from .config import PolicyConfig
from .correction import source
from .fairshare import FairShare
from .jobqueue import JobQueue, NameTaken
from .onepass import Pass, PassResult
from .quota import Quotas, need, over_quota
from .reservations import Reservation
from .slack import latest_start, urgent_before
from .timemodel import LocalityModel
from .types import Pending, QueuedJob
from .windows import Window, WindowHold, confined

__all__ = ["PassResult", "Rejected", "Reservation", "Scheduler", "planned_runtime"]


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
                              if self.config.mode == "backfill" else 0.0,
                              self.config.protect_span, state.cluster.total_gpus)
        self.fairshare = FairShare(self.config, now)
        self.timemodel = timemodel or LocalityModel.for_policy(self.config)
        self.running: dict[str, QueuedJob] = {}
        self.quotas = Quotas(self.config)       # what each team holds, against its quota
        self.stopping: dict[str, str] = {}      # preempted job -> the job it stops for
        self.claims: dict[str, list[str]] = {}  # preemptor -> the jobs it stopped
        # protected job -> the earliest start its reservations promised: what backfilled
        # jobs' limits are cut to, so that none can delay it beyond its grace
        self.promised: dict[str, float] = {}
        # backfilled job -> (when it yields, the reserved job it yields to): see requeue
        self.yields: dict[str, tuple[float, str]] = {}
        self._seq = 0
        self._empty = state.empty_like()
        self._never: dict[tuple, str | None] = {}
        self._best_tier: dict[tuple, int] = {}
        # the last pass's reservations: the state epoch they were planned in, those the
        # pass made in the order it made them (see onepass.Pass.reserve), all that stood, and
        # whether it began with reservations carried over
        self.reuse_reservations = True
        self._planned: tuple[tuple, list[Reservation], list[Reservation], bool] = (
            (), [], [], False)
        # the admins' reservations (windows.py), and those the last pass held
        self.windows: dict[str, Window] = {}
        self._live_windows: tuple = ()

    # -- what drivers call -----------------------------------------------------------------
    def submit(self, spec: JobSpec, now: float, runtime: float | None = None,
               preempted_by: frozenset[str] = frozenset(), behind: bool = False,
               deadline: float | None = None, seq: int | None = None) -> QueuedJob:
        """Queue a job; raises Rejected if it can never run (naming why), InputError for
        an unknown job class. `preempted_by`: the jobs that once preempted it; `behind`:
        requeued as idle, it goes after its band's other jobs (jobqueue.py); `deadline`:
        the spec's on this scheduler's clock (see _make); `seq`: its place among jobs
        queued at the same time (default: after those submitted before it), for a driver
        that submits jobs out of their order (the service's leader: warm.py)."""
        spec = resolve(spec, self.reg.job_classes, defaults=self.config.defaults)
        if spec.name in self.queue or spec.name in self.running:
            raise NameTaken(f"job {spec.name!r}: name: a job of that name is already queued "
                             "or running; job names must be unique")
        job = self._make(spec, now, runtime, deadline, seq)
        job.preempted_by, job.behind = frozenset(preempted_by), behind
        why = self.rejection(job)
        if why:
            raise Rejected(spec.name, why)
        self.queue.add(job)
        return job

    def restore(self, spec: JobSpec, allocations, start: float,
                runtime: float | None = None, deadline: float | None = None,
                borrowed: bool = False, preempted_by: frozenset[str] = frozenset(),
                stopping: tuple[str, float] | None = None) -> None:
        """A job that already holds resources (a driver rebuilding from its store);
        `deadline`: when it is stopped, if it was cut (else start + its time limit);
        `stopping`: (the preemptor, when it is gone) for a job being preempted. Its
        spec's deadline stays its pipeline's (a job with one is no victim of a rule
        on_deadline in its own band)."""
        job = self._make(resolve(spec, self.reg.job_classes, defaults=self.config.defaults),
                         start, runtime)
        job.borrowed, job.preempted_by = borrowed, frozenset(preempted_by)
        self._start(job, allocations, start, deadline)
        if stopping is not None:
            self.stopping[job.name] = stopping[0]
            self._end_by(job.name, stopping[1])

    def stop(self, victim: QueuedJob, by: QueuedJob, now: float) -> float:
        """Preempt `victim` for `by`: it keeps its resources until the driver has stopped
        it (signal, grace) and calls `requeue`; returns when it is gone at the latest."""
        self.stopping[victim.name] = by.name
        return self._end_by(victim.name, now + victim.preempt_grace)

    def _end_by(self, name: str, at: float) -> float:
        end = min(self.state.expected_end[name], at)
        self.state.set_end(name, end)
        self.state.hard_end[name] = min(self.state.hard_end.get(name, math.inf), at)
        self.state.epoch += 1
        return at

    def requeue(self, name: str, now: float, runtime: float | None = None) -> QueuedJob:
        """A preempted job has stopped: its resources return and it is queued again under
        the same name and submit time (`runtime`: the work it has left). One stopped
        because it overran into a reservation becomes due for protection after the job
        it yielded to and every protected job: with its old submit time it could be
        protected first and take back the resources their promises count on (the service
        does the same with queued_at: preemption.behind_reserved)."""
        job = self.running[name]
        by = self.stopping.pop(name, None)
        at, reserved = self.yields.get(name, (math.inf, ""))
        self.finish(name, now)
        submit = job.submit
        ahead = [self.queue.protect_due(self.queue.jobs[n]) for n in (reserved, *self.promised)
                 if n in self.queue] if now >= at else []
        if ahead:            # due for protection after them (1 ms: float rounding)
            submit = max(submit, max(ahead) - (self.queue.protect_due(job) - job.submit)
                         + 1e-3)
        again = self._make(job.spec, submit, job.estimate if runtime is None else runtime,
                           job.deadline)
        again.preempted_by = job.preempted_by | ({by} if by else set())
        self.queue.add(again)
        return again

    def _make(self, spec: JobSpec, submit: float, runtime: float | None,
              deadline: float | None = None, seq: int | None = None) -> QueuedJob:
        """A resolved spec as a queue entry; the runtime defaults to the spec's (or its
        class's), else the policy's, and is planned times its team's estimate factor
        (correction.py), never past its time limit. With a deadline (`deadline`, on this
        scheduler's clock, else the spec's as Unix time: the service's clock), its latest
        start is the deadline less that runtime on its best placement (a gang of hosts
        runs slower than on one) and the spec's downstream work (slack.py)."""
        jc = self.reg.job_classes.get(spec.job_class or "")
        if runtime is None:
            runtime = planned_runtime(spec, self.config)
        limit = float(spec.time_limit or math.inf)
        factor = self.timemodel.estimates.factor(
            spec.team, source(spec.expected_runtime, spec.time_limit))
        job = self.queue.make(spec, submit, self._seq if seq is None else seq,
                              min(float(runtime) * factor, limit),
                              jc.priority_weight if jc else 0)
        job.estimate, job.limit = float(runtime), limit
        if deadline is None and spec.deadline is not None:
            deadline = spec.deadline.timestamp()
        if deadline is not None and deadline < math.inf:
            job.deadline = float(deadline)
            job.latest_start = latest_start(
                job.deadline, self.runtime(job, self.best_tier(job)), spec.downstream)
        job.grace = float(stop_grace(spec, self.reg.job_classes, self.config.defaults))
        (job.preemptible, job.preempt_signal, job.preempt_grace,
         job.checkpoint_interval) = preempt_options(jc, job.grace)
        self._seq += 1
        return job

    def rejection(self, job: QueuedJob) -> str | None:
        # a job inside an admin's reservation counts against no quota
        why = None if job.spec.reservation is not None else over_quota(
            self.config, job.team, need(job), job.preemptible)
        if why:
            return why
        if self.config.mode == "count":
            total = self.state.cluster.total_gpus
            return None if job.gpus <= total else (
                f"needs {job.gpus} GPUs, the cluster has {total}")
        if job.shape not in self._never:
            spec = job.spec
            w = self.windows.get(spec.reservation or "")
            if w is not None:       # it runs on the window's hosts only
                spec = confined(spec, w)
            why = never_fits(spec, self._empty, self.reg, job.needs)
            if why and w is not None:
                why = f"reservation {w.name!r} ({', '.join(w.hosts)}) cannot hold it: {why}"
            self._never[job.shape] = why
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
        self.claims.pop(name, None)
        self.stopping.pop(name, None)
        self.yields.pop(name, None)
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
            self.timemodel.observe_run(
                job.job_class, job.team, source(job.spec.expected_runtime, job.spec.time_limit),
                tier_of(self.state.allocations[name]), job.estimate,
                now - self.state.started[name])
        self.state.release(name)
        if job.spec.reservation is None:     # a reservation's jobs count on no quota
            self.quotas.add(job, -1)
        self.fairshare.add(job.account, -float(job.charge), now)

    def set_windows(self, windows: list[Window]) -> None:
        """The admins' reservations from now on (a driver sets them before submits that
        ask for them, and whenever they change)."""
        new = {w.name: w for w in windows}
        if new != self.windows:
            self.windows = new
            self._never = {k: v for k, v in self._never.items() if k[-1] is None}
            self.state.epoch += 1        # plans made around the old ones may be wrong

    # -- the pass ----------------------------------------------------------------------
    def fairshare_points(self, now: float) -> dict[str, float]:
        """The fair-share points of the queued jobs' teams at `now`, as the pass orders by."""
        self.fairshare.advance(now)
        return self.fairshare.factors(self.queue.accounts)

    def protect_before(self, now: float) -> float:
        """Jobs submitted at or before this are protected (the wait guarantee; backfill)."""
        return now - self.config.reserve_after if self.config.mode == "backfill" \
            else -math.inf

    def urgent_before(self, now: float) -> float:
        """Jobs whose latest start is before this go ahead in their band (backfill)."""
        return urgent_before(now, self.config.deadline_slack) \
            if self.config.mode == "backfill" else -math.inf

    def priorities(self, now: float) -> list[tuple[QueuedJob, bool, dict[str, float]]]:
        """The queued jobs in the order the pass considers them (claimants of an earlier
        preemption first, then `JobQueue.ordered`), each with whether it is protected and
        its score's terms (JobQueue.terms): Slurm's sprio."""
        fs = self.fairshare_points(now)
        first = [self.queue.jobs[n] for n in self.claims if n in self.queue.jobs]
        seen = {j.name for j in first}
        order = [(j, False) for j in first] + [
            (j, protected) for j, protected in self.queue.ordered(
                fs, self.protect_before(now), urgent_before=self.urgent_before(now),
                promised=self.promised, now=now)
            if j.name not in seen]
        return [(j, protected, self.queue.terms(j, fs.get(j.account, 0.0), now))
                for j, protected in order]

    def schedule(self, now: float, explain: bool = False) -> PassResult:
        cfg = self.config
        live = tuple(sorted(n for n, w in self.windows.items() if w.end > now))
        if live != self._live_windows:      # one ended: its hosts are back
            self._live_windows = live
            self.state.epoch += 1
        fs = self.fairshare_points(now)
        p = Pass(self, now, explain)
        untested = (f"not tested this pass: {cfg.max_jobs_tested} jobs of higher priority "
                    "were (max_jobs_tested)")
        try:
            for name in list(self.claims):     # preemptors first: their victims stop for them
                p.claimant(name)
            for job, protected in self.queue.ordered(
                    fs, p.protect_before, None if explain else p.hopeless,
                    self.urgent_before(now), self.promised, now):
                if job.name in p.claimants:
                    continue
                if p.result.tested >= cfg.max_jobs_tested:
                    if not explain:
                        break
                    p.wait(job, Pending("Priority", untested))
                    continue
                p.result.tested += 1
                p.protect_left -= protected
                p.consider(job, protected)
                if p.done():
                    break
        finally:
            p.plan.hold_first(0)
            # the reasons point back at the pass: unlinked, the pass and all it made are
            # freed as it ends, not left for a walk of the collector over the whole heap
            p.reasons = None
        for job, _ in p.result.started:
            self.queue.remove(job.name)
            self.promised.pop(job.name, None)
            self.claims.pop(job.name, None)
        jobs = [r for r in p.reservations if not isinstance(r, WindowHold)]
        p.result.reservations = jobs
        self._planned = (self.plan_epoch(), p.plan.made, jobs, p.plan.had_carried)
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
        if job.spec.reservation is None:
            self.quotas.add(job)
        else:           # its reservation's hosts serve no one else: nothing to free
            job.preemptible = False
        self.fairshare.add(job.account, float(job.charge), now)
