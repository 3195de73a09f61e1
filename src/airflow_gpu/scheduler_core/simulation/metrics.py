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
    dag_run: str | None = None        # its pipeline (pipelines.py)
    deadline: float | None = None     # when its pipeline must be done


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
    # pipeline (dag_run, else a deadline job's id) -> the earliest it could end
    pipeline_bounds: dict[str, float] = field(default_factory=dict)
    # a deadline job -> its latest start as the scheduler computed it (the last submit)
    latest_starts: dict[str, float] = field(default_factory=dict)
    # a deadline job waiting at its latest start -> whether it could have been placed
    # then on the resources free (holds aside)
    could_start: dict[str, bool] = field(default_factory=dict)

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
    if res.pipeline_bounds:
        out.update(deadline_metrics(res))
    out["passes"] = res.passes
    out["wall_s"] = round(res.wall_s, 3)
    return out


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def deadline_metrics(res: SimResult) -> dict:
    """Pipelines (a dag_run, or a lone job with a deadline) against their deadlines: met
    when the last job ends by it. One whose deadline is before the earliest it could end
    on an empty cluster (pipelines.earliest_ends) is infeasible, counted apart; one with a
    job that never ran is missed. Background jobs: those of no pipeline."""
    jobs: dict[str, list[JobRecord]] = {}
    background = []
    for r in res.records:
        if r.dag_run is None and r.deadline is None:
            background.append(r)
        else:
            jobs.setdefault(r.dag_run or r.job_id, []).append(r)
    met = missed = infeasible = avoidable = 0
    late: list[float] = []
    for key, rs in jobs.items():
        deadlines = [r.deadline for r in rs if r.deadline is not None]
        if not deadlines:
            continue                  # a pipeline without a deadline
        deadline = min(deadlines)
        if deadline < res.pipeline_bounds.get(key, -math.inf) - 1e-6:
            infeasible += 1
            continue
        ends = [r.end for r in rs]
        end = math.inf if None in ends else max(ends)
        if end <= deadline + 1e-6:
            met += 1
        else:
            missed += 1
            late.append(end - deadline)
            avoidable += _avoidable(res, rs)
    late.sort()
    done = [r.start - r.submit for r in background if r.end is not None]
    # submit to end: the wait, and the work preemption made them run again
    jct = [r.end - r.submit for r in background if r.end is not None]
    finite = [x for x in late if x < math.inf]
    return {"pipelines": met + missed, "pipelines_met": met,
            "pipelines_met_frac": met / (met + missed) if met + missed else 1.0,
            "pipelines_infeasible": infeasible,
            "pipelines_missed_avoidable": avoidable,
            "pipelines_unfinished": len(late) - len(finite),
            "pipelines_late_p50_s": _quantile(finite, 0.5) if finite else 0.0,
            "pipelines_late_p95_s": _quantile(finite, 0.95) if finite else 0.0,
            "pipeline_jobs": sum(len(rs) for rs in jobs.values()),
            "background_jobs": len(done),
            "background_avg_wait_s": sum(done) / len(done) if done else 0.0,
            "background_avg_jct_s": sum(jct) / len(jct) if jct else 0.0,
            "background_preempted": sum(r.preemptions > 0 for r in background)}


def _avoidable(res: SimResult, rs: list[JobRecord]) -> int:
    """1 if the missed pipeline's first job to start past its latest start was waiting
    then while it could have been placed on the resources free at that moment (holds
    of reservations aside; the simulator tries it then): starting it at its latest start
    was possible, so the miss is the policy's, not the load's."""
    late = [(res.latest_starts[r.job_id], r) for r in rs if r.job_id in res.latest_starts
            and (r.start is None or r.start > res.latest_starts[r.job_id] + 1e-6)]
    if not late:
        return 0
    at, r = min(late, key=lambda x: x[0])
    if r.submit > at or at == -math.inf:
        return 0                      # it came too late to start by then
    return int(res.could_start.get(r.job_id, False))
