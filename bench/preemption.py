"""Quota borrowing and priority preemption on a shared trace: four policies, one scenario.

Run it directly (about 4 minutes on two cores; the hard-quota replays take longest):

    .venv/bin/python bench/preemption.py [--trace itp-cluster08] [--hosts N] [--limit N]
                                         [--checkpoint-interval 30m] [--jobs 2]
                                         [--out bench/results/preemption]

The scenario: the trace replays on the cluster `bench/replay.py` sizes for it (80-100 %
offered load). Each job gets a team from a hash of its id, with uneven demand: a 50 %,
b 25 %, c 15 %, d 10 % of the jobs. About 5 % of the jobs, picked by a second hash among
the short ones (an hour or less: urgent validation, a hotfix run), get priority 100; the
rest 0. Each team is guaranteed a quarter of the cluster's GPUs (`quota_gpus`). Jobs
larger than a quarter are left out (a hard quota would reject them, and all four
policies must replay the same jobs).

Policies: hard quotas (`borrow_gpus: 0`) or borrowing (`borrow_gpus: null`, no limit),
each without preemption or with it (`rules: [{min_band: 100, preempts_below: 100}]`,
`reclaim: true` where there is borrowing, `min_run_time: 10m`, `min_saved_wait: 15m`).
Jobs checkpoint every `--checkpoint-interval`; a preempted job loses the work since its
last checkpoint plus its grace (30 s), and runs the rest when it starts again.

Writes `preemption.json` (every metric, the scenario) and `preemption.md` (the table and
the issue's targets) and PNG plots under `--out` (git-ignored).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import sys
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import airflow_gpu
from airflow_gpu.scheduler_core.engine.cluster import synthetic_cluster
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from airflow_gpu.scheduler_core.units import parse_duration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import HOST_GPUS, SETUPS, TRACES, arrival_window, load, offered_load  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "preemption"
TEAMS = (("a", 0.50), ("b", 0.25), ("c", 0.15), ("d", 0.10))   # share of the jobs
HIGH, HIGH_SHARE, SHORT = 100, 0.05, 3600
PREEMPT = {"rules": [{"min_band": HIGH, "preempts_below": HIGH}], "min_run_time": 600,
           "min_saved_wait": 900}
SWEEP_SAVED_WAIT = (0, 300)                  # and the main run's 15 min
SWEEP_CHECKPOINT = (0, 600, 1800, 7200)     # 0: no checkpoints
POLICIES = {   # label -> (borrow_gpus, preemption section)
    "hard quotas": (0, {"reclaim": False}),
    "hard quotas + preemption": (0, {**PREEMPT, "reclaim": False}),
    "borrowing": (None, {"reclaim": False}),
    "borrowing + preemption": (None, {**PREEMPT, "reclaim": True}),
}


def unit(text: str) -> float:
    """A number in [0, 1) from a hash: the same job gets the same draw on every run."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def scenario(trace: list[TraceJob], quota: int) -> list[TraceJob]:
    """Teams by hash, the high band among the short jobs, jobs over a quota left out."""
    trace = [t for t in trace if t.gpus <= quota]
    short = sum(t.duration <= SHORT for t in trace)
    pick = min(1.0, HIGH_SHARE * len(trace) / max(short, 1))   # ~5 % of all the jobs
    out = []
    for t in trace:
        u, acc = unit(f"team:{t.job_id}"), 0.0
        team = TEAMS[-1][0]
        for name, share in TEAMS:
            acc += share
            if u < acc:
                team = name
                break
        high = t.duration <= SHORT and unit(f"priority:{t.job_id}") < pick
        out.append(dataclasses.replace(t, team=team, priority=HIGH if high else 0))
    return out


def policy(label: str, gpus: int, slowdown, **preemption) -> PolicyConfig:
    borrow, section = POLICIES[label]
    quota = gpus // len(TEAMS)
    return PolicyConfig(locality_slowdown=slowdown, preemption={**section, **preemption},
                        teams={name: {"quota_gpus": quota, "borrow_gpus": borrow}
                               for name, _ in TEAMS})


def window_utilization(res, lo: float, hi: float) -> float:
    """GPUs held over the arrival window [lo, hi] (the busy series is a step function)."""
    held = 0.0
    for k in range(len(res.times)):
        a = max(res.times[k], lo)
        b = min(res.times[k + 1] if k + 1 < len(res.times) else hi, hi)
        if b > a:
            held += res.busy[k] * (b - a)
    return held / (res.total_gpus * (hi - lo)) if hi > lo else 0.0


def run(task: tuple) -> dict:
    """One replay (in a worker process)."""
    label, base, changes, name, hosts, traces, limit, checkpoint, slowdown = task
    cluster = synthetic_cluster(hosts, "dgx-a100")
    trace = scenario(load(name, traces, limit), cluster.total_gpus // len(TEAMS))
    options = SimOptions(policy(base, cluster.total_gpus, slowdown, **changes), slowdown,
                         checkpoint_interval=checkpoint or None, high_priority=HIGH)
    res = simulate(cluster, trace, options)
    res.policy = label          # the plots' legend
    lo, hi = arrival_window(trace)
    return {**res.metrics(), "policy": label, "checkpoint_interval_s": checkpoint,
            "window_utilization": window_utilization(res, lo, hi), "_result": res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="itp-cluster08", choices=list(SETUPS))
    ap.add_argument("--hosts", type=int, help="cluster size (default: replay.py's for the "
                    "trace, 80-100 %% offered load)")
    ap.add_argument("--traces", type=Path, default=TRACES, help="folder of trace CSV files")
    ap.add_argument("--limit", type=int, help="replay only the first N jobs")
    ap.add_argument("--checkpoint-interval", default="30m", help="0: no checkpoints")
    ap.add_argument("--locality-slowdown", default="1.0,1.1,1.3")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false",
                    help="replay only the four policies, not the knobs of borrowing + "
                    "preemption (min_saved_wait, checkpoint interval)")
    ap.add_argument("--jobs", type=int, default=2, help="replays run at once (processes)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    slowdown = tuple(float(v) for v in args.locality_slowdown.split(","))
    hosts = args.hosts or SETUPS[args.trace][0]
    checkpoint = parse_duration(args.checkpoint_interval)
    gpus = hosts * HOST_GPUS
    full = load(args.trace, args.traces, args.limit)
    trace = scenario(full, gpus // len(TEAMS))
    where = (args.trace, hosts, args.traces, args.limit)
    tasks = [(label, label, {}, *where, checkpoint, slowdown) for label in POLICIES]
    if args.sweep:
        # the two knobs of borrowing + preemption, one at a time from the main run's
        both = "borrowing + preemption"
        tasks += [(f"min_saved_wait {hours(v)}", both, {"min_saved_wait": v}, *where,
                   checkpoint, slowdown) for v in SWEEP_SAVED_WAIT]
        tasks += [(f"checkpoints {hours(v) if v else 'none'}", both, {}, *where, v,
                   slowdown) for v in SWEEP_CHECKPOINT if v != checkpoint]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = []
        for r in pool.map(run, tasks):
            print(f"{r['policy']:32s} util {r['gpu_utilization']:.1%}  high-prio p95 "
                  f"{hours(r['hi_p95_wait_s'])}  lost {r['lost_fraction']:.2%}  "
                  f"replay {r['wall_s']:.1f}s", flush=True)
            runs.append(r)
    setup = {
        "trace": args.trace, "hosts": hosts, "gpus": gpus, "limit": args.limit,
        "arrival_speedup": SETUPS[args.trace][1], "jobs": len(trace),
        "left_out_over_quota": len(full) - len(trace), "quota_gpus": gpus // len(TEAMS),
        "teams": {name: sum(t.team == name for t in trace) for name, _ in TEAMS},
        "team_gpu_hours": {name: round(sum(t.duration * t.gpus for t in trace
                                           if t.team == name) / 3600) for name, _ in TEAMS},
        "high_priority_jobs": sum(t.priority == HIGH for t in trace),
        "checkpoint_interval_s": checkpoint, "locality_slowdown": slowdown,
        "offered_load": offered_load(trace, gpus),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    results = [r.pop("_result") for r in runs]
    results = [res for res in results if res.policy in POLICIES]
    try:
        from airflow_gpu.scheduler_core.simulation.simplots import write_plots

        write_plots(results, args.out, f"({args.trace}, {hosts} hosts)")
    except Exception as exc:    # noqa: BLE001 (plots are optional: matplotlib may be absent)
        print(f"no plots: {exc}")
    report = {"benchmark": "borrowing and preemption", "version": airflow_gpu.__version__,
              "when": datetime.now(UTC).isoformat(timespec="seconds"),
              "python": sys.version.split()[0], "machine": platform.machine(),
              "scenario": setup, "policies": {k: {"borrow_gpus": b, "preemption": p}
                                              for k, (b, p) in POLICIES.items()},
              "runs": runs, "targets": targets(runs)}
    (args.out / "preemption.json").write_text(json.dumps(report, indent=2))
    (args.out / "preemption.md").write_text(markdown(runs, setup))
    print((args.out / "preemption.md").read_text())
    print(f"written to {args.out}")
    return 0


def targets(runs: list[dict]) -> dict:
    """The issue's targets: borrowing raises utilization by 10 points or more over hard
    quotas; preemption cuts the high band's p95 wait 5x or more (with borrowing both
    ways), losing under 2 % of the GPU-hours."""
    by = {r["policy"]: r for r in runs}
    hard, borrow, both = by["hard quotas"], by["borrowing"], by["borrowing + preemption"]
    gain = borrow["gpu_utilization"] - hard["gpu_utilization"]
    ratio = borrow["hi_p95_wait_s"] / max(both["hi_p95_wait_s"], 1.0)
    return {"utilization_gain_points": round(100 * gain, 1), "utilization_met": gain >= 0.10,
            "hi_p95_ratio": round(ratio, 1), "hi_p95_met": ratio >= 5,
            "lost_percent": round(100 * both["lost_fraction"], 2),
            "lost_met": both["lost_fraction"] < 0.02}


def every(checkpoint: float) -> str:
    return f"checkpoints every {hours(checkpoint)}" if checkpoint else "no checkpoints"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def markdown(runs: list[dict], s: dict) -> str:
    t = targets(runs)
    yes = {True: "met", False: "**not met**"}
    teams = ", ".join(f"{k} {v:,} jobs ({s['team_gpu_hours'][k]:,} GPU-h)"
                      for k, v in s["teams"].items())
    lines = [
        f"{s['trace']} on {s['hosts']} dgx-a100 hosts ({s['gpus']} GPUs), offered load "
        f"{s['offered_load']['middle_90']:.0%} (middle 90 %) / "
        f"{s['offered_load']['whole_trace']:.0%} (whole trace); {s['jobs']:,} jobs "
        f"({s['left_out_over_quota']} larger than a quota left out); teams {teams}, each "
        f"guaranteed {s['quota_gpus']} GPUs; {s['high_priority_jobs']} high-priority jobs; "
        f"{every(s['checkpoint_interval_s'])}; locality slowdown "
        f"{'/'.join(map(str, s['locality_slowdown']))}.", "",
        HEADER, RULE]
    for r in runs:
        if r["policy"] in POLICIES:
            lines.append(row(r))
    lines += ["", "Targets (issue 14):", "",
              f"- borrowing raises GPU utilization over hard quotas by >= 10 points: "
              f"{t['utilization_gain_points']:+.1f} points, {yes[t['utilization_met']]}",
              f"- preemption cuts the high-priority p95 wait >= 5x (borrowing + preemption "
              f"against borrowing): {t['hi_p95_ratio']:.1f}x, {yes[t['hi_p95_met']]}",
              f"- GPU-hours lost to preemption < 2 % of the total: {t['lost_percent']:.2f} %, "
              f"{yes[t['lost_met']]}"]
    sweep = [r for r in runs if r["policy"] not in POLICIES]
    if sweep:
        lines += ["", "Borrowing + preemption, one knob changed at a time (min_saved_wait "
                  f"15 min, {every(s['checkpoint_interval_s'])} otherwise):",
                  "", HEADER, RULE, row(by_label(runs, "borrowing + preemption"))]
        lines += [row(r) for r in sweep]
    return "\n".join(lines) + "\n"


HEADER = ("| policy | GPU util | util (arrivals) | high-prio avg wait | high-prio p95 wait | "
          "avg wait | avg JCT | preemptions | GPU-h lost (% of total) | replay |")
RULE = "|---|---|---|---|---|---|---|---|---|---|"


def by_label(runs: list[dict], label: str) -> dict:
    return next(r for r in runs if r["policy"] == label)


def row(r: dict) -> str:
    return (f"| {r['policy']} | {r['gpu_utilization']:.1%} | {r['window_utilization']:.1%} | "
            f"{hours(r['hi_avg_wait_s'])} | {hours(r['hi_p95_wait_s'])} | "
            f"{hours(r['avg_wait_s'])} | {hours(r['avg_jct_s'])} | {r['preemptions']:,} | "
            f"{r['lost_gpu_hours']:,.0f} ({r['lost_fraction']:.2%}) | {r['wall_s']:.0f} s |")


if __name__ == "__main__":
    sys.exit(main())
