"""`simulate`: replay a job trace through the scheduler with a virtual clock.

Events are job arrivals (the trace's submit times), job ends (start + work left x
locality slowdown) and the stops of preempted jobs. At each distinct event time the
ends and stops are applied, the arrivals submitted, and one scheduling pass runs: the
same `Scheduler.schedule` as everywhere, which also decides every preemption and quota
reclaim. Each job's planned runtime is its `expected_runtime` column, else its
`time_limit`, else its trace duration (users who know their runtimes; the slowdown is not
known in advance; `estimates.py` derives wrong ones). Time
limits are enforced: a job still running at its own limit ends then plus its grace, as a
job that ignores SIGTERM would (`timeout`).

Preemption: a victim keeps its resources through its preempt grace (it is stopping),
then is requeued with the work it had not checkpointed yet (`progress.py`). A job
backfilled ahead of a reservation that is still running when the reservation starts
(it overran its estimate) is stopped the same way and requeued, as the service does
(service/overrun.py); it is counted once, when it really ends.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.cluster import Cluster, tier_of_hosts
from ..engine.state import ClusterState
from ..jobspec import JobSpec
from ..plugins import Registry, default_registry
from ..policy.config import PolicyConfig
from ..policy.reservations import place_best
from ..policy.scheduler import PassResult, Rejected, Scheduler
from ..policy.windows import Window, window_of
from .metrics import JobRecord, SimResult
from .pipelines import Gate, downstream, earliest_ends
from .progress import Run, stop
from .trace import TraceJob, job_spec

GiB = 2**30


@dataclass
class SimOptions:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    slowdown: tuple[float, float, float] = (1.0, 1.1, 1.3)   # one host / one switch / across
    cpus_per_gpu: int = 4
    memory_per_gpu: int = 32 * GiB
    # seconds between a job's checkpoints, where its job class sets none: what a
    # preemption loses is the work since the last one (None or 0: no checkpoints, all)
    checkpoint_interval: float | None = 1800
    high_priority: int = 100          # jobs of this priority or more: the `hi_*` metrics
    # a trace job's spec, where the caller gives its own (e.g. MIG devices for some jobs;
    # bench/mig.py); None: trace.job_spec
    spec_of: Callable[[TraceJob], JobSpec] | None = None
    # the hardware jobs really run on, where the scheduler is shown another view of it
    # (bench/nvlink_domain.py: placement blind to NVLink domains); hosts are matched by
    # name and the slowdown tier is taken on these. None: the scheduler's own cluster.
    true_cluster: Cluster | None = None
    # admins' reservations (maintenance, teams'), times in the trace's seconds
    windows: list[Window] = field(default_factory=list)


class _Events:
    """Ends and stops by time; a job has at most one live event (a later push replaces
    it: a preempted job no longer ends when it would have). Wake-ups are times when a
    pass must run though nothing ends: a job becomes preemptible."""

    def __init__(self):
        self.heap: list[tuple[float, int, str]] = []
        self.live: dict[str, int] = {}
        self.seq = 0
        self.wakes: list[float] = []

    def push(self, t: float, name: str) -> None:
        self.seq += 1
        self.live[name] = self.seq
        heapq.heappush(self.heap, (t, self.seq, name))

    def wake(self, t: float) -> None:
        heapq.heappush(self.wakes, t)

    def next_time(self) -> float:
        while self.heap and self.live.get(self.heap[0][2]) != self.heap[0][1]:
            heapq.heappop(self.heap)      # replaced
        return min(self.heap[0][0] if self.heap else math.inf,
                   self.wakes[0] if self.wakes else math.inf)

    def pop_due(self, now: float) -> list[str]:
        while self.wakes and self.wakes[0] <= now:
            heapq.heappop(self.wakes)
        due = []
        while self.next_time() == now:
            _, _, name = heapq.heappop(self.heap)
            del self.live[name]
            due.append(name)
        return due


def simulate(cluster: Cluster, trace: list[TraceJob], options: SimOptions | None = None,
             reg: Registry | None = None,
             observe: Callable[[Scheduler, PassResult], None] | None = None) -> SimResult:
    """Replay `trace`; `observe(scheduler, pass_result)` sees every pass (tests, tools)."""
    options = options or SimOptions()
    started_at = time.perf_counter()
    sched = Scheduler(ClusterState(cluster), options.policy, reg or default_registry())
    sched.set_windows(options.windows)
    host_gpus = cluster.max_host_gpus
    total = cluster.total_gpus
    mig = any(h.type.mig is not None for h in cluster.hosts)
    trace = sorted(trace, key=lambda t: t.submit)            # stable: file order on ties
    records = {t.job_id: JobRecord(t.job_id, t.team, t.gpus, t.submit, t.duration, t.priority,
                                   dag_run=t.dag_run, deadline=t.deadline)
               for t in trace}
    result = SimResult(options.policy.mode, cluster.name, total, host_gpus,
                       list(records.values()), high_priority=options.high_priority)
    # pipelines: jobs held until their upstream jobs end (pipelines.py)
    piped = any(t.upstream or t.deadline is not None for t in trace)
    gate = Gate(trace)
    down = downstream(trace) if piped else {}
    if piped:
        result.pipeline_bounds = earliest_ends(trace)
    order = {t.job_id: k for k, t in enumerate(trace)}
    ready: list[tuple[float, int, TraceJob]] = []     # released: (submit, order, job)
    if gate.waiting:
        trace = [t for t in trace if not gate.held(t)]
    events = _Events()
    for w in options.windows:       # a pass as each starts (jobs yield) and ends (hosts back)
        events.wake(w.start)
        events.wake(w.end)
    ids: dict[str, str] = {}                      # job name -> trace id
    planned: dict[str, float] = {}                # job name -> its planned runtime
    work: dict[str, float] = {}                   # job name -> work left (s at factor 1)
    runs: dict[str, Run] = {}                     # job name -> its current admission
    # job name -> (when it yields, to which job, when it ends if it need not)
    yielding: dict[str, tuple[float, str, float]] = {}
    preempt = options.policy.preemption
    # a pass when a job has run min_run_time: a job waiting may preempt it from then on
    # (only where something can preempt: extra passes would change other replays)
    can = preempt.rules or (preempt.reclaim and options.policy.has_gpu_quotas)
    min_run = preempt.min_run_time if can else None

    def checkpoints(job) -> None:
        # the replay's interval where the job class says none: the scheduler picks its
        # victims by the work they would lose, so it must know it too
        if job.checkpoint_interval is None:
            job.checkpoint_interval = options.checkpoint_interval or None

    # deadline jobs by latest start: whether each, waiting then, could have started on
    # the resources free at that moment (the avoidable misses, metrics.py)
    due: list[tuple[float, str, str]] = []          # (latest start, job name, trace id)
    i, n = 0, len(trace)
    while True:
        now = min(trace[i].submit if i < n else math.inf, events.next_time(),
                  ready[0][0] if ready else math.inf)
        if now == math.inf:
            break
        while due and due[0][0] < now:      # nothing changed since the last pass
            _, name, tid = heapq.heappop(due)
            job = sched.queue.jobs.get(name)
            if job is not None and tid not in result.could_start:
                result.could_start[tid] = place_best(
                    job, sched.state, sched.reg, sched.best_tier(job)) is not None
        for name in events.pop_due(now):
            run, rec = runs.pop(name), records[ids[name]]
            rec.held_gpu_s += run.gpus * (now - run.start)
            if run.signal is None:
                sched.finish(name, now, completed=not rec.timeout)
                rec.end = now
                for t in gate.ended(rec.job_id):      # its last upstream job ended
                    heapq.heappush(ready, (max(t.submit, now), order[t.job_id], t))
                continue
            # a preempted or overrunning job stopped: it is queued again with the work it
            # had not saved
            left, lost = stop(run, now)
            work[name] = left
            rec.lost_gpu_s += run.gpus * lost
            if yielding.pop(name, (None,))[0] == run.signal:
                rec.overrun_stops += 1
            else:
                rec.preemptions += 1
            again = sched.requeue(name, now, runtime=planned[name] * left / rec.duration)
            checkpoints(again)
        arrivals = []
        while i < n and trace[i].submit == now:
            arrivals.append(trace[i])
            i += 1
        if ready and ready[0][0] == now:        # in trace order with the others
            while ready and ready[0][0] == now:
                arrivals.append(heapq.heappop(ready)[2])
                records[arrivals[-1].job_id].submit = now
            arrivals.sort(key=lambda t: order[t.job_id])
        for t in arrivals:
            spec = (options.spec_of(t) if options.spec_of is not None else
                    job_spec(t, host_gpus, options.cpus_per_gpu, options.memory_per_gpu))
            if t.deadline is not None:      # what the operators send: its work after it
                spec = spec.model_copy(update={"downstream": math.ceil(down[t.job_id])})
            try:
                queued = sched.submit(spec, now, t.planned, deadline=t.deadline)
                checkpoints(queued)
                if t.deadline is not None:
                    result.latest_starts[t.job_id] = queued.latest_start
                    heapq.heappush(due, (queued.latest_start, spec.name, t.job_id))
                ids[spec.name] = t.job_id
                planned[spec.name] = t.planned
                work[spec.name] = t.duration
            except Rejected as exc:
                records[t.job_id].rejected = exc.reason
                for after in gate.never(t.job_id):
                    records[after.job_id].rejected = f"upstream job {t.job_id!r} was rejected"
        done = sched.schedule(now)
        result.passes += 1
        if observe is not None:
            observe(sched, done)
        for p in done.preempted:
            run = runs[p.victim.name]
            # signalled, it runs on through its grace; one that would end (or reach its
            # time limit) by then just ends, and is neither requeued nor charged
            if run.end > p.stop_at and (run.signal is None or run.signal > now):
                run.signal = now
                events.push(p.stop_at, p.victim.name)
        for job, placed in done.started:
            rec = records[ids[job.name]]
            hosts = {a.host.index for a in placed.allocations}
            switches = {a.host.switch_key for a in placed.allocations}
            # one host or one NVLink domain / one switch / across switches (tier_of_hosts)
            real = options.true_cluster
            factor = options.slowdown[tier_of_hosts(
                real.by_name[a.host.name] if real is not None else a.host
                for a in placed.allocations)]
            if rec.start is None:
                rec.start = now
            rec.hosts, rec.switches = len(hosts), len(switches)
            rec.borrowed = rec.borrowed or job.borrowed
            end = now + work[job.name] * factor
            # past its time limit it is stopped, and gone after the grace at the latest;
            # past a reservation it backfilled ahead of, it yields: stopped and requeued
            hard_end = sched.state.hard_end.get(job.name, math.inf)
            yields = job.name in done.cut and hard_end < end
            rec.timeout = hard_end < end and not yields
            # held and lost GPU-seconds charge MIG devices by their share (quota.py)
            runs[job.name] = Run(now, factor, work[job.name], float(job.charge),
                                 min(end, hard_end), job.checkpoint_interval)
            if yields:
                at, by = done.cut[job.name]
                runs[job.name].signal = at
                yielding[job.name] = (at, by, min(end, now + job.limit + job.grace))
            events.push(min(end, hard_end), job.name)
            if min_run and now + min_run < min(end, hard_end):
                events.wake(now + min_run)
        for name, (at, by, free_end) in list(yielding.items()):
            # the reserved job started or left: nothing needs it to yield (as the
            # service); an admin's reservation stays
            if at > now and by not in sched.queue and window_of(by) is None:
                del yielding[name]
                run = runs[name]
                run.signal, run.end = None, free_end
                records[ids[name]].timeout = free_end < run.start + run.work * run.factor
                events.push(free_end, name)
        result.times.append(now)
        if mig:      # MIG GPUs are never free whole: count the devices' shares held
            result.busy.append(sum(float(j.charge) for j in sched.running.values()))
        else:
            result.busy.append(total - sched.state.usable_total)   # nothing is drained
        result.queued.append(len(sched.queue))
    result.wall_s = time.perf_counter() - started_at
    return result
