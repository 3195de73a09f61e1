"""Pipelines that meet their deadlines: nightly pipelines on a loaded shared cluster,
under the default policy with deadlines, the same with a preemption rule `on_deadline`
(a job whose deadline is at risk stops band-0 work without a deadline), with
`deadline_slack: 0` (priority only) and under `count` (what Airflow pools give).

    .venv/bin/python bench/deadlines.py [--trace itp-cluster03] [--start-day 21]
        [--days 21] [--load 0.9] [--per-night 4] [--seeds 1,2,3]
        [--slack 4h] [--write-trace FILE] [--out bench/results/deadlines.json]

The background is a window of a shared trace (`--start-day`, `--days`), its submit
times from the window's start; the nightly pipelines (simulation/nightly.py: ETL ->
train -> validate, 3-5 GPU tasks, due 1.2-3x their critical path) come from a seeded RNG.
The cluster is 8-GPU dgx-a100 hosts, as many as give an offered load of `--load` (all
the GPU-hours submitted over the window's, pipelines included). Runtimes are exact.

Prints one table and writes every metric to `--out` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from airflow_gpu.scheduler_core.engine.cluster import synthetic_cluster
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.nightly import (
    DAY,
    mixed,
    pipelines,
    window,
    write_trace,
)
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import load_trace
from airflow_gpu.scheduler_core.units import format_duration, parse_duration

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "deadlines.json"
HOST_GPUS = 8
SLOWDOWN = (1.0, 1.1, 1.3)


RULE = {"rules": [{"on_deadline": True, "preempts_below": 1}]}


def policies(slack: int | None) -> dict[str, PolicyConfig]:
    own = {} if slack is None else {"deadline_slack": slack}
    return {"deadlines": PolicyConfig(**own),
            "deadlines + on_deadline rule": PolicyConfig(**own, preemption=RULE),
            "priority only": PolicyConfig(deadline_slack=0),
            "count": PolicyConfig(mode="count")}


def hosts_for(jobs, span: float, load: float) -> int:
    """Hosts that make the offered load `load`, and at least the largest job's."""
    work = sum(t.duration * t.gpus for t in jobs)
    need = max(math.ceil(t.gpus / HOST_GPUS) for t in jobs)
    return max(need, round(work / (load * HOST_GPUS * span)))


def row(label: str, m: dict) -> str:
    d = format_duration
    return (f"| {label} | {m['pipelines_met']}/{m['pipelines']} "
            f"({m['pipelines_met_frac']:.1%}) | {d(m['pipelines_late_p50_s'])} | "
            f"{d(m['pipelines_late_p95_s'])} | {m['pipelines_infeasible']} | "
            f"{m['pipelines_missed_avoidable']} | "
            f"{m['background_avg_wait_s'] / 3600:.2f} h | "
            f"{m['background_avg_jct_s'] / 3600:.2f} h | {m['background_preempted']} | "
            f"{m['lost_gpu_hours']:.0f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="itp-cluster03")
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--start-day", type=float, default=21)
    ap.add_argument("--days", type=int, default=21)
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--per-night", type=int, default=4)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--slack", help="deadline_slack of the deadline-aware policy "
                    "(default: the policy's default)")
    ap.add_argument("--write-trace", help="also write the first seed's workload here")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    background = window(load_trace(args.traces / f"{args.trace}.csv"),
                        args.start_day * DAY, args.days * DAY)
    out = {"trace": args.trace, "start_day": args.start_day, "days": args.days,
           "load": args.load, "per_night": args.per_night, "runs": []}
    print("| policy | seed | hosts | pipelines met | late p50 | late p95 | infeasible | "
          "missed, avoidable | background avg wait | background avg JCT | "
          "background preempted | GPU-h lost |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for seed in (int(s) for s in args.seeds.split(",")):
        jobs = mixed(background, pipelines(args.days, args.per_night, seed))
        if args.write_trace and seed == int(args.seeds.split(",")[0]):
            write_trace(jobs, args.write_trace)
        hosts = hosts_for(jobs, args.days * DAY, args.load)
        cluster = synthetic_cluster(hosts, "dgx-a100")
        for label, policy in policies(
                None if args.slack is None else parse_duration(args.slack)).items():
            policy = policy.model_copy(update={"locality_slowdown": SLOWDOWN})
            m = simulate(cluster, jobs, SimOptions(policy, SLOWDOWN)).metrics()
            out["runs"].append({**m, "mode": m["policy"], "policy": label, "seed": seed,
                                "hosts": hosts})
            print(row(f"{label} | {seed} | {hosts}", m), flush=True)
    print()
    print("| policy | pipelines met | late p50 (mean over seeds) | late p95 (mean) | "
          "missed, avoidable | background avg wait | vs priority only | "
          "background avg JCT | vs priority only |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label in policies(None):
        runs = [r for r in out["runs"] if r["policy"] == label]
        met, total = sum(r["pipelines_met"] for r in runs), sum(r["pipelines"] for r in runs)
        out.setdefault("summary", {})[label] = {
            "pipelines_met": met, "pipelines": total,
            **{k: sum(r[f"pipelines_{k}"] for r in runs) / len(runs)
               for k in ("late_p50_s", "late_p95_s")},
            "missed_avoidable": sum(r["pipelines_missed_avoidable"] for r in runs),
            **{k: sum(r[k] for r in runs) / len(runs)
               for k in ("background_avg_wait_s", "background_avg_jct_s")}}
    base = out["summary"]["priority only"]
    for label, m in out["summary"].items():
        d = format_duration
        wait, jct = m["background_avg_wait_s"], m["background_avg_jct_s"]
        print(f"| {label} | {m['pipelines_met']}/{m['pipelines']} "
              f"({m['pipelines_met'] / max(1, m['pipelines']):.1%}) | {d(m['late_p50_s'])} | "
              f"{d(m['late_p95_s'])} | {m['missed_avoidable']} | {wait / 3600:.2f} h | "
              f"{wait / base['background_avg_wait_s'] - 1:+.1%} | {jct / 3600:.2f} h | "
              f"{jct / base['background_avg_jct_s'] - 1:+.1%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
