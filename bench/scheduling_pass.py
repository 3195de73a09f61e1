"""The cost of one scheduling pass with a long queue on a large, busy cluster.

Run it with `make bench`, or directly:

    .venv/bin/python bench/scheduling_pass.py [--hosts 1024] [--pending 5000] [--passes 50]
                                              [--seed 1] [--repeat 1] [--deadlines 0]
                                              [--out bench/results/pass.json]

The cluster (dgx-a100 hosts, 16 per leaf switch) is filled with running jobs whose
expected ends spread over the next three days, and one in thirty of them ends (so some
GPUs are free, scattered). Then `--pending` jobs wait, submitted over
the last five days (so the oldest have passed `reserve_after` and get reservations), with
Philly's job-size mix: mostly 1-GPU jobs, some 2/4/8-GPU ones, a few gangs of 2-8 whole
hosts; the oldest, submitted eight days ago, is a gang of 64 whole hosts. Timed on one
core:

- the first pass (cold: every reservation is walked, as the service's passes are: it
  rebuilds the engine from its store each time), with and without pending reasons;
- `--passes` passes of the same scheduler as jobs end one at a time (warm: the
  simulator's case, where reservations that still stand are reused);
- the explained cold pass again with four teams, each guaranteed a quarter of the GPUs
  and free to borrow, one of them holding most of the cluster, 5 % of the pending jobs
  in an urgent band that may preempt: the pass that reclaims and preempts.

`--deadlines F`: a share F of the pending jobs are pipelines' jobs with a deadline, their
latest starts spread from an hour ago to six hours ahead (so some are urgent, some lost
causes, some not yet urgent), and the preempting policy gains the rule
`{on_deadline: true, preempts_below: 1}`: what deadlines add to each pass.

What the scenario's build left is frozen (gc.freeze) before each timed pass. Results go
to `bench/results/pass.json` (git-ignored) and a short table is printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import airflow_gpu
from airflow_gpu.scheduler_core.engine.cluster import synthetic_cluster
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from airflow_gpu.scheduler_core.simulation.trace import TraceJob, job_spec
from placement import engine_commit, pin_to_one_core

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "pass.json"
# GPUs per job and their share, rounded from Philly's mix
SIZES = ((1, 0.80), (2, 0.04), (4, 0.06), (8, 0.06), (16, 0.025), (32, 0.01), (64, 0.005))
GiB = 2**30


def draw_size(rng: random.Random) -> int:
    x = rng.random()
    for gpus, share in SIZES:
        if x < share:
            return gpus
        x -= share
    return SIZES[0][0]


def spec(name: str, gpus: int, host_gpus: int):
    return job_spec(TraceJob(name, 0, 1, gpus), host_gpus, 4, 32 * GiB)


TEAMS = "abcd"


def preempting_policy(hosts: int, deadlines: bool = False) -> PolicyConfig:
    quarter = hosts * 8 // len(TEAMS)
    rules = [{"min_band": 100, "preempts_below": 100}]
    return PolicyConfig.model_validate({
        "teams": {t: {"quota_gpus": quarter, "borrow_gpus": None} for t in TEAMS},
        "preemption": {"rules": rules + ([{"on_deadline": True, "preempts_below": 1}]
                                         if deadlines else [])}})


def build(hosts: int, pending: int, seed: int, now: float, teams: bool = False,
          deadlines: float = 0.0) -> Scheduler:
    """A scheduler at `now`: the cluster as full as the size mix lets it be, `pending`
    waiting (a share `deadlines` of them with a deadline); `teams`: with
    preempting_policy, most running work team a's (borrowed)."""
    cluster = synthetic_cluster(hosts, "dgx-a100")
    policy = preempting_policy(hosts, deadlines > 0) if teams else PolicyConfig()
    sched = Scheduler(ClusterState(cluster), policy, now=now - 5 * 86400)
    rng = random.Random(seed)
    host_gpus = cluster.max_host_gpus

    def make(name: str, gpus: int, running: bool):
        s = spec(name, gpus, host_gpus)
        if not teams:
            return s
        team = "a" if running and rng.random() < 0.6 else rng.choice(TEAMS)
        urgent = not running and rng.random() < 0.05
        return s.model_copy(update={"team": team, "priority": 100 if urgent else 0})

    misses, i = 0, 0
    started_at = now - (3600 if teams else 1)    # with teams: past the minimum run time
    while misses < 200:        # fill: start jobs until 200 in a row no longer fit
        gpus = draw_size(rng)
        sched.submit(make(f"run-{i}", gpus, True), started_at, rng.uniform(60, 3 * 86400))
        started = sched.schedule(started_at).started
        if not started:
            sched.finish(f"run-{i}", started_at)
            misses += 1
        i += 1
    # a busy cluster is fragmented: some jobs ended since the last pass
    for name in rng.sample(sorted(sched.running), len(sched.running) // 30):
        sched.finish(name, started_at)
    # the oldest, 8 days old, waits for 64 whole hosts: due for protection before the
    # others (a gang of its size after 1.3 days), the pass protects it with a reservation
    sched.submit(make("wait-oldest", 512, False), now - 8 * 86400, 86400)
    due = random.Random(seed + 1)       # the same jobs with and without deadlines
    for k in range(pending - 1):
        submit = now - rng.uniform(0, 5 * 86400)
        s = make(f"wait-{k}", draw_size(rng), False)
        runtime = rng.uniform(600, 2 * 86400)
        deadline = (now + due.uniform(-3600, 6 * 3600) + runtime
                    if due.random() < deadlines else None)
        sched.submit(s, submit, runtime, deadline=deadline)
    return sched


def timed(fn, cpu: list | None = None):
    # what the scenario's build left is frozen first: else a full collection of it,
    # 0.1-0.2 s, lands in whichever pass comes next (the pass's own garbage still counts)
    gc.freeze()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    if cpu is not None:     # CPU time: what the pass costs, whatever else shares the core
        cpu.append(time.process_time() - c0)
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--pending", type=int, default=5000)
    ap.add_argument("--passes", type=int, default=50, help="warm passes, one job ending each")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1,
                    help="preempting passes, each on a fresh build (median and best kept)")
    ap.add_argument("--deadlines", type=float, default=0.0,
                    help="share of the pending jobs with a deadline (0-1)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    cpu = pin_to_one_core()
    now = 10 * 86400.0
    dl = args.deadlines
    sched, build_s = timed(lambda: build(args.hosts, args.pending, args.seed, now,
                                         deadlines=dl))
    free = sched.state.usable_total
    cold, cold_s = timed(lambda: sched.schedule(now))
    # the same cold pass again, explained (what the service runs): a fresh scheduler
    explained = build(args.hosts, args.pending, args.seed, now, deadlines=dl)
    _, explain_s = timed(lambda: explained.schedule(now, explain=True))
    walls, cpus = [], []
    for _ in range(args.repeat):
        teams = build(args.hosts, args.pending, args.seed, now, teams=True, deadlines=dl)
        preempting, wall = timed(lambda teams=teams: teams.schedule(now, explain=True), cpus)
        walls.append(wall)
        del teams
        gc.unfreeze()
        gc.collect()
    preempt_s = statistics.median(walls)
    warm = []
    t = now
    for _ in range(args.passes):
        name = min(sched.state.expected_end, key=sched.state.expected_end.get)
        t = max(t, sched.state.expected_end[name])
        sched.finish(name, t, completed=True)
        warm.append(timed(lambda t=t: sched.schedule(t))[1])
    warm.sort()
    result = {
        "benchmark": "scheduling pass", "version": airflow_gpu.__version__,
        "engine_commit": engine_commit(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "machine": platform.machine(), "pinned_cpu": cpu,
        "hosts": args.hosts, "gpus": sched.state.cluster.total_gpus, "pending": args.pending,
        "deadlines": dl,
        "running": len(sched.running), "free_gpus_before": free, "build_s": round(build_s, 2),
        "cold_pass_ms": round(cold_s * 1e3, 1), "cold_pass_explained_ms": round(explain_s * 1e3, 1),
        "cold_started": len(cold.started), "cold_reservations": len(cold.reservations),
        "cold_tested": cold.tested,
        "preempting_pass_explained_ms": round(preempt_s * 1e3, 1),
        "preempting_passes": args.repeat,
        "preempting_pass_best_ms": round(min(walls) * 1e3, 1),
        "preempting_pass_cpu_median_ms": round(statistics.median(cpus) * 1e3, 1),
        "preempting_pass_cpu_best_ms": round(min(cpus) * 1e3, 1),
        "preempting_pass_victims": len(preempting.preempted),
        "warm_passes": len(warm), "warm_pass_median_ms": round(statistics.median(warm) * 1e3, 1),
        "warm_pass_p95_ms": round(warm[int(0.95 * (len(warm) - 1))] * 1e3, 1),
        "warm_pass_max_ms": round(warm[-1] * 1e3, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{args.hosts} hosts, {args.pending} pending, {result['running']} running: "
          f"cold pass {result['cold_pass_ms']} ms ({result['cold_reservations']} reservations,"
          f" {result['cold_tested']} jobs tested), explained {result['cold_pass_explained_ms']}"
          f" ms; warm pass median {result['warm_pass_median_ms']} ms, p95 "
          f"{result['warm_pass_p95_ms']} ms; with teams and preemption, explained "
          f"{result['preempting_pass_explained_ms']} ms ({len(preempting.preempted)} "
          f"preempted; median of {args.repeat}, best {result['preempting_pass_best_ms']} ms; "
          f"CPU median {result['preempting_pass_cpu_median_ms']} ms, best "
          f"{result['preempting_pass_cpu_best_ms']} ms)")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
