"""The result of a replay, one record per job, and its metrics (docs/queue-policy.md,
"Replaying traces")."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field


@dataclass
class JobRecord:
    job_id: str
    team: str
    gpus: int
    submit: float
    duration: float
    priority: int = 0
    start: float | None = None        # its first start (the wait ends there)
    end: float | None = None          # its final end
    hosts: int = 0                    # of its last placement
    switches: int = 0
    rejected: str | None = None
    timeout: bool = False             # stopped at its time limit
    preemptions: int = 0
    overrun_stops: int = 0            # stopped past its estimate at a reservation, requeued
    held_gpu_s: float = 0.0           # GPU-seconds held, over every admission
    lost_gpu_s: float = 0.0           # of which lost to preemption (rerun or stopping)
    borrowed: bool = False            # it ran on borrowed quota at least once


@dataclass
class SimResult:
    policy: str
    cluster: str
    total_gpus: int
    host_gpus: int
    records: list[JobRecord]
    times: array = field(default_factory=lambda: array("d"))      # one sample per pass
    # GPUs held (a MIG device by its share of its GPU, as quotas charge it)
    busy: array = field(default_factory=lambda: array("d"))
    queued: array = field(default_factory=lambda: array("l"))     # jobs waiting
    passes: int = 0
    wall_s: float = 0.0
    high_priority: int = 100

    def write_records(self, path: str) -> None:
        """One CSV row per job: when it was submitted, started and ended, and where."""
        import csv

        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["job_id", "team", "gpus", "submit", "start", "end", "duration",
                        "hosts", "switches", "rejected", "priority", "preemptions",
                        "held_gpu_s", "lost_gpu_s", "borrowed"])
            for r in self.records:
                w.writerow([r.job_id, r.team, r.gpus, r.submit, r.start, r.end, r.duration,
                            r.hosts, r.switches, r.rejected or "", r.priority, r.preemptions,
                            round(r.held_gpu_s, 3), round(r.lost_gpu_s, 3), int(r.borrowed)])

    def metrics(self) -> dict:
        return replay_metrics(self)


_BSLD_FLOOR = 600.0      # seconds: shorter jobs count as this long (bounded slowdown)


def p95(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(0.95 * len(sorted_values)) - 1)]


def replay_metrics(res: SimResult) -> dict:
    done = [r for r in res.records if r.end is not None]
    accepted = [r for r in res.records if r.rejected is None]
    waits = sorted(r.start - r.submit for r in done)
    out: dict = {"policy": res.policy, "cluster": res.cluster,
                 "total_gpus": res.total_gpus, "jobs": len(done),
                 "rejected": len(res.records) - len(accepted),
                 "unfinished": len(accepted) - len(done),
                 "timeouts": sum(r.timeout for r in done)}
    held = sum(r.held_gpu_s for r in res.records)     # jobs stopped and never back too
    lost = sum(r.lost_gpu_s for r in res.records)
    if done:
        t0 = min(r.submit for r in done)
        makespan = max(r.end for r in done) - t0
        multi = [r for r in done if r.gpus > 1]

        def useful(r) -> float:   # seconds it ran, less what preemption made it rerun
            return (r.held_gpu_s - r.lost_gpu_s) / r.gpus

        out.update(
            avg_jct_s=sum(r.end - r.submit for r in done) / len(done),
            avg_wait_s=sum(waits) / len(waits),
            p95_wait_s=p95(waits),
            makespan_s=makespan,
            # every GPU-second held, the work preemption threw away included
            gpu_utilization=held / (res.total_gpus * makespan) if makespan > 0 else 0.0,
            multi_gpu_jobs_min_hosts_frac=(
                sum(r.hosts == -(-r.gpus // res.host_gpus) for r in multi) / len(multi)
                if multi else 1.0),
            avg_slowdown=sum(useful(r) / r.duration for r in done) / len(done),
            # GPU-hours lost to the locality slowdown (jobs spread over hosts run longer)
            slowdown_gpu_hours=sum(r.gpus * (useful(r) - r.duration) for r in done) / 3600,
            max_wait_s=waits[-1],
        )
        # bounded slowdown (Feitelson): (wait + runtime) / max(runtime, 10 min), what a
        # wait means to the job that waited; its tail is the long jobs' as much as p95's
        bsld = sorted((r.end - r.submit) / max(r.end - r.start, _BSLD_FLOOR) for r in done)
        out["avg_bounded_slowdown"] = sum(bsld) / len(bsld)
        out["p95_bounded_slowdown"] = p95(bsld)
        large = [r.start - r.submit for r in done if r.gpus > res.host_gpus]
        out["large_jobs"] = len(large)      # jobs bigger than one host: gangs of hosts
        out["avg_wait_large_s"] = sum(large) / len(large) if large else 0.0
        hi = sorted(r.start - r.submit for r in done if r.priority >= res.high_priority)
        out["hi_jobs"] = len(hi)
        out["hi_avg_wait_s"] = sum(hi) / len(hi) if hi else 0.0
        out["hi_p95_wait_s"] = p95(hi) if hi else 0.0
        out["hi_max_wait_s"] = hi[-1] if hi else 0.0
    out["preemptions"] = sum(r.preemptions for r in res.records)
    out["preempted_jobs"] = sum(r.preemptions > 0 for r in res.records)
    # requeued when a reservation they backfilled ahead of started (they overran)
    out["overrun_stops"] = sum(r.overrun_stops for r in res.records)
    out["borrowed_jobs"] = sum(r.borrowed for r in res.records)
    out["gpu_hours"] = held / 3600
    out["lost_gpu_hours"] = lost / 3600
    out["lost_fraction"] = lost / held if held else 0.0
    if accepted:
        t0 = min(r.submit for r in accepted)
        out["makespan_lower_bound_s"] = max(
            max(r.submit + r.duration for r in accepted) - t0,
            sum(r.duration * r.gpus for r in accepted) / res.total_gpus)
        out["avg_jct_lower_bound_s"] = sum(r.duration for r in accepted) / len(accepted)
    out["passes"] = res.passes
    out["wall_s"] = round(res.wall_s, 3)
    return out
