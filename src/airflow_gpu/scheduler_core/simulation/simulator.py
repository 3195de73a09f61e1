"""`simulate`: replay a job trace through the scheduler with a virtual clock.

Events are job arrivals (the trace's submit times) and job ends (start + duration *
locality slowdown). At each distinct event time the ends are applied, the arrivals
submitted, and one scheduling pass runs: the same `Scheduler.schedule` as everywhere.
Each job's planned runtime is its `expected_runtime` column, else its trace duration
(users who know their runtimes; the slowdown is not known in advance). Time limits are
enforced: a job still running at its limit (its own, or the one backfill cut it to) ends
then plus its grace, as a job that ignores SIGTERM would.
"""

from __future__ import annotations

import heapq
import math
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.cluster import Cluster
from ..engine.state import ClusterState
from ..plugins import Registry, default_registry
from ..policy.config import PolicyConfig
from ..policy.scheduler import PassResult, Rejected, Scheduler
from .trace import TraceJob, job_spec

GiB = 2**30


@dataclass
class SimOptions:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    slowdown: tuple[float, float, float] = (1.0, 1.1, 1.3)   # one host / one switch / across
    cpus_per_gpu: int = 4
    memory_per_gpu: int = 32 * GiB


@dataclass
class JobRecord:
    job_id: str
    team: str
    gpus: int
    submit: float
    duration: float
    start: float | None = None
    end: float | None = None
    hosts: int = 0
    switches: int = 0
    rejected: str | None = None
    timeout: bool = False    # stopped at its time limit


@dataclass
class SimResult:
    policy: str
    cluster: str
    total_gpus: int
    host_gpus: int
    records: list[JobRecord]
    times: array = field(default_factory=lambda: array("d"))      # one sample per pass
    busy: array = field(default_factory=lambda: array("l"))       # GPUs held
    queued: array = field(default_factory=lambda: array("l"))     # jobs waiting
    passes: int = 0
    wall_s: float = 0.0

    def write_records(self, path: str) -> None:
        """One CSV row per job: when it was submitted, started and ended, and where."""
        import csv

        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["job_id", "team", "gpus", "submit", "start", "end", "duration",
                        "hosts", "switches", "rejected"])
            for r in self.records:
                w.writerow([r.job_id, r.team, r.gpus, r.submit, r.start, r.end, r.duration,
                            r.hosts, r.switches, r.rejected or ""])

    def metrics(self) -> dict:
        done = [r for r in self.records if r.end is not None]
        accepted = [r for r in self.records if r.rejected is None]
        waits = sorted(r.start - r.submit for r in done)
        out: dict = {"policy": self.policy, "cluster": self.cluster,
                     "total_gpus": self.total_gpus, "jobs": len(done),
                     "rejected": len(self.records) - len(accepted),
                     "unfinished": len(accepted) - len(done),
                     "timeouts": sum(r.timeout for r in done)}
        if done:
            t0 = min(r.submit for r in done)
            makespan = max(r.end for r in done) - t0
            multi = [r for r in done if r.gpus > 1]
            out.update(
                avg_jct_s=sum(r.end - r.submit for r in done) / len(done),
                avg_wait_s=sum(waits) / len(waits),
                p95_wait_s=waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)],
                makespan_s=makespan,
                gpu_utilization=(sum(r.gpus * (r.end - r.start) for r in done)
                                 / (self.total_gpus * makespan) if makespan > 0 else 0.0),
                multi_gpu_jobs_min_hosts_frac=(
                    sum(r.hosts == -(-r.gpus // self.host_gpus) for r in multi) / len(multi)
                    if multi else 1.0),
                avg_slowdown=sum((r.end - r.start) / r.duration for r in done) / len(done),
                # GPU-hours lost to the locality slowdown (jobs spread over hosts run longer)
                slowdown_gpu_hours=sum(r.gpus * (r.end - r.start - r.duration)
                                       for r in done) / 3600,
                max_wait_s=waits[-1],
            )
            large = [r.start - r.submit for r in done if r.gpus > self.host_gpus]
            out["large_jobs"] = len(large)      # jobs bigger than one host: gangs of hosts
            out["avg_wait_large_s"] = sum(large) / len(large) if large else 0.0
        if accepted:
            t0 = min(r.submit for r in accepted)
            out["makespan_lower_bound_s"] = max(
                max(r.submit + r.duration for r in accepted) - t0,
                sum(r.duration * r.gpus for r in accepted) / self.total_gpus)
            out["avg_jct_lower_bound_s"] = sum(r.duration for r in accepted) / len(accepted)
        out["passes"] = self.passes
        out["wall_s"] = round(self.wall_s, 3)
        return out


def simulate(cluster: Cluster, trace: list[TraceJob], options: SimOptions | None = None,
             reg: Registry | None = None,
             observe: Callable[[Scheduler, PassResult], None] | None = None) -> SimResult:
    """Replay `trace`; `observe(scheduler, pass_result)` sees every pass (tests, tools)."""
    options = options or SimOptions()
    started_at = time.perf_counter()
    sched = Scheduler(ClusterState(cluster), options.policy, reg or default_registry())
    host_gpus = cluster.max_host_gpus
    total = cluster.total_gpus
    trace = sorted(trace, key=lambda t: t.submit)            # stable: file order on ties
    records = {t.job_id: JobRecord(t.job_id, t.team, t.gpus, t.submit, t.duration)
               for t in trace}
    result = SimResult(options.policy.mode, cluster.name, total, host_gpus,
                       list(records.values()))
    ends: list[tuple[float, int, str]] = []                  # (end, tiebreak, job name)
    ids: dict[str, str] = {}                                 # job name -> trace id
    i, n = 0, len(trace)
    while i < n or ends:
        now = min(trace[i].submit if i < n else math.inf, ends[0][0] if ends else math.inf)
        while ends and ends[0][0] == now:
            _, _, name = heapq.heappop(ends)
            rec = records[ids[name]]
            sched.finish(name, now, completed=not rec.timeout)
            rec.end = now
        while i < n and trace[i].submit == now:
            t = trace[i]
            i += 1
            spec = job_spec(t, host_gpus, options.cpus_per_gpu, options.memory_per_gpu)
            try:
                sched.submit(spec, now, t.expected_runtime or t.duration)
                ids[spec.name] = t.job_id
            except Rejected as exc:
                records[t.job_id].rejected = exc.reason
        done = sched.schedule(now)
        result.passes += 1
        if observe is not None:
            observe(sched, done)
        for job, placed in done.started:
            rec = records[ids[job.name]]
            hosts = {a.host.index for a in placed.allocations}
            switches = {a.host.switch_key for a in placed.allocations}
            factor = options.slowdown[0 if len(hosts) <= 1 else 1 if len(switches) == 1 else 2]
            rec.start, rec.hosts, rec.switches = now, len(hosts), len(switches)
            end = now + rec.duration * factor
            # past its time limit it is stopped, and gone after the grace at the latest
            hard_end = sched.state.hard_end.get(job.name, math.inf)
            rec.timeout = hard_end < end
            heapq.heappush(ends, (min(end, hard_end), result.passes, job.name))
        result.times.append(now)
        result.busy.append(total - sched.state.usable_total)   # nothing is drained here
        result.queued.append(len(sched.queue))
    result.wall_s = time.perf_counter() - started_at
    return result
