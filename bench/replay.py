"""Replay every shared GPU-cluster trace on a cluster where it queues, under each policy.

Run it with `make bench`, or directly:

    .venv/bin/python bench/replay.py [--only philly,itp-cluster02] [--limit N]
                                     [--curve 0,1d,2d,3d,5d,7d,10d,inf] [--jobs 2]
                                     [--with FIELD=VALUE ...]
                                     [--estimate-error exact,lognormal:0.5,limit:1.5-10]
                                     [--locality-slowdown 1.0,1.1,1.3]
                                     [--out bench/results/replay]

Each trace runs on 8-GPU dgx-a100 hosts (16 per leaf switch, 4 switches per rack), sized
so that its offered load is 80-100 %: the GPU-hours submitted in the span that holds the
middle 90 % of the work, over the cluster's GPU-hours in that span. Where whole hosts
cannot reach that (small traces whose largest job needs more hosts than their load), the
trace's arrivals are sped up by a factor (`SETUPS`). An idle cluster proves nothing.

Policies: `fifo`, `count` (GPU counts only, what Airflow pools give), `backfill` (the
default) and the curve of its knob, `reserve_after`: the wait after which the oldest
job of a band is protected by a reservation, for the smallest jobs (a job of the whole
cluster waits `reserve_after_scale` times as long; 0 protects at once; inf never).

Estimate modes (`--estimate-error`, a comma-separated list): what the scheduler is told
of runtimes, as `simulate`'s modes. Every mode replays the three policies (and the
`--with` variants); the curve runs in the first mode only.

Writes `replay.json` (every metric, the bounds, the sizes, the replay wall time),
`replay.md` (tables: the policies, the targets against `count`, the curve) and PNG plots
(`<trace>/wait_cdf.png`, `utilization.png`, `queue_length.png`, and `curve.png`, average
against maximum wait per `reserve_after`) under `--out` (git-ignored).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import airflow_gpu
from airflow_gpu.scheduler_core.engine.cluster import synthetic_cluster
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.estimates import (
    parse_estimate_error,
    with_estimates,
)
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob, load_trace
from airflow_gpu.scheduler_core.units import MAX_DURATION, parse_duration

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
# trace -> (hosts, arrival speed-up)
SETUPS = {"philly": (224, 1.0), "itp-cluster01": (8, 2.0), "itp-cluster02": (12, 1.0),
          "itp-cluster03": (25, 1.0), "itp-cluster05": (2, 1.4), "itp-cluster06": (12, 1.0),
          "itp-cluster08": (9, 1.0), "itp-cluster09": (4, 1.0), "itp-cluster10": (2, 2.2)}
POLICIES = ("fifo", "count", "backfill")
CURVE = "0,6h,12h,1d,2d,3d,7d,inf"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "replay"
HOST_GPUS = 8


def load(name: str, traces: Path, limit: int | None,
         estimates: str = "exact") -> list[TraceJob]:
    trace = with_estimates(load_trace(traces / f"{name}.csv", limit),
                           parse_estimate_error(estimates))
    speedup = SETUPS[name][1]
    if speedup != 1.0:
        trace = [dataclasses.replace(t, submit=t.submit / speedup) for t in trace]
    return trace


def arrival_window(trace: list[TraceJob]) -> tuple[float, float]:
    """The span of submit times holding the middle 90 % of the submitted work."""
    jobs = sorted((t.submit, t.duration * t.gpus) for t in trace)
    work, done, lo, hi = sum(w for _, w in jobs), 0.0, None, None
    for t, w in jobs:
        done += w
        if lo is None and done >= 0.05 * work:
            lo = t
        if hi is None and done >= 0.95 * work:
            hi = t
    return lo, hi


def offered_load(trace: list[TraceJob], gpus: int) -> dict:
    """GPU-hours submitted over GPU-hours available: in the span holding the middle 90 %
    of the work, and over the whole trace."""
    jobs = sorted((t.submit, t.duration * t.gpus) for t in trace)
    work = sum(w for _, w in jobs)
    lo, hi = arrival_window(trace)
    span = jobs[-1][0] - jobs[0][0]
    return {"middle_90": round(0.9 * work / (gpus * max(hi - lo, 1.0)), 3),
            "whole_trace": round(work / (gpus * max(span, 1.0)), 3)}


def run(task: tuple) -> dict:
    """One replay (in a worker process): (trace, label, policy fields, ...)."""
    name, label, fields, (traces, limit, estimates), slowdown, with_records = task
    hosts = SETUPS[name][0]
    cluster = synthetic_cluster(hosts, "dgx-a100")
    policy = PolicyConfig(locality_slowdown=slowdown, **fields)
    res = simulate(cluster, load(name, traces, limit, estimates),
                   SimOptions(policy, slowdown))
    out = {"trace": name, "label": label, "estimates": estimates, "hosts": hosts,
           **res.metrics()}
    if with_records:
        out["_result"] = res
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(SETUPS), help="comma-separated trace names")
    ap.add_argument("--traces", type=Path, default=TRACES, help="folder of trace CSV files")
    ap.add_argument("--limit", type=int, help="replay only the first N jobs of each trace")
    ap.add_argument("--curve", default=CURVE, help="reserve_after values for the curve "
                    "('' for none)")
    ap.add_argument("--locality-slowdown", default="1.0,1.1,1.3")
    ap.add_argument("--with", dest="variants", action="append", default=[],
                    metavar="FIELD=VALUE[,...]", help="also replay backfill with these policy "
                    "fields changed (repeatable), e.g. --with reserve_after=0,size_weight=0")
    ap.add_argument("--estimate-error", default="exact", help="what the scheduler is told "
                    "of runtimes, comma-separated: exact, lognormal:SIGMA, limit:LO-HI "
                    "(simulate's modes); the curve runs in the first")
    ap.add_argument("--jobs", type=int, default=1, help="replays run at once (processes)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    slowdown = tuple(float(v) for v in args.locality_slowdown.split(","))
    names = args.only.split(",")
    unknown = [n for n in names if n not in SETUPS]
    if unknown:
        ap.error(f"--only: unknown trace {unknown[0]!r}; known: {', '.join(SETUPS)}")
    curve = [v.strip() for v in args.curve.split(",") if v.strip()]
    modes = [str(parse_estimate_error(m)) for m in args.estimate_error.split(",")]
    src = (args.traces, args.limit, modes[0])
    tasks = []
    for name in names:
        for mode in modes:
            here = (args.traces, args.limit, mode)
            for policy in POLICIES:     # plots: the first mode's
                tasks.append((name, policy, {"mode": policy}, here, slowdown,
                              mode == modes[0]))
            for variant in args.variants:     # FIELD=VALUE[,FIELD=VALUE...]
                fields = dict(kv.split("=", 1) for kv in re.split(r",(?=\w+=)", variant))
                tasks.append((name, f"with {variant}", fields, here, slowdown, False))
        for v in curve:
            seconds = math.inf if v == "inf" else parse_duration(v)
            # inf: never (the longest duration a policy takes, far past any trace)
            fields = {"reserve_after": MAX_DURATION if seconds == math.inf else seconds}
            tasks.append((name, f"reserve_after={v}", fields, src, slowdown, False))
    args.out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = []
        for r in pool.map(run, tasks):
            print(f"{r['trace']:14s} {r['estimates']:14s} {r['label']:22s} avg wait "
                  f"{fmt(r['avg_wait_s']):>9s}  p95 {fmt(r['p95_wait_s']):>9s}  max wait "
                  f"{fmt(r['max_wait_s']):>9s}  overrun stops {r['overrun_stops']:>4d}  "
                  f"timeouts {r['timeouts']:>4d}  replay {r['wall_s']:.1f}s", flush=True)
            runs.append(r)
    loads = {}
    for name in names:
        hosts = SETUPS[name][0]
        loads[name] = {"hosts": hosts, "gpus": hosts * HOST_GPUS,
                       "arrival_speedup": SETUPS[name][1],
                       **offered_load(load(name, args.traces, args.limit), hosts * HOST_GPUS)}
        results = [r.pop("_result") for r in runs if r["trace"] == name and "_result" in r]
        first = [r for r in runs if r["trace"] == name and r["estimates"] == modes[0]]
        from airflow_gpu.scheduler_core.simulation.simplots import write_plots

        write_plots(results, args.out / name, f"({name}, {hosts} hosts)")
        plot_curve(first, args.out / name / "curve.png", name)
    plot_curves([r for r in runs if r["estimates"] == modes[0]], list(loads),
                args.out / "curves.png")
    report = {
        "benchmark": "trace replay", "version": airflow_gpu.__version__,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "machine": platform.machine(),
        "locality_slowdown": slowdown, "limit": args.limit, "estimate_error": modes,
        "sizes": loads,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs],
    }
    (args.out / "replay.json").write_text(json.dumps(report, indent=2))
    (args.out / "replay.md").write_text(markdown(runs, loads, slowdown, modes))
    print((args.out / "replay.md").read_text())
    print(f"written to {args.out}")
    return 0


def fmt(seconds: float) -> str:
    return f"{seconds / 3600:.1f}h"


def targets(runs: list[dict], name: str, mode: str) -> dict:
    """The default policy against count (issue targets): average JCT below count's;
    average, p95 and max wait at or below count's; max wait at most 0.4x count's; every
    multi-GPU job on its fewest hosts."""
    by = {r["label"]: r for r in runs if r["trace"] == name and r["estimates"] == mode}
    b, c = by["backfill"], by["count"]
    return {"avg_jct": b["avg_jct_s"] < c["avg_jct_s"],
            "avg_wait": b["avg_wait_s"] <= c["avg_wait_s"],
            "p95_wait": b["p95_wait_s"] <= c["p95_wait_s"],
            "max_wait": b["max_wait_s"] <= c["max_wait_s"],
            "max_04": b["max_wait_s"] <= 0.4 * c["max_wait_s"],
            "min_hosts": b["multi_gpu_jobs_min_hosts_frac"] == 1.0}


def markdown(runs: list[dict], loads: dict, slowdown, modes: list[str]) -> str:
    lines = [f"Locality slowdown (one host / one switch / across switches): {slowdown}", "",
             "| trace | hosts (GPUs) | arrivals | offered load (middle 90 % / whole) |",
             "|---|---|---|---|"]
    for name, x in loads.items():
        lines.append(f"| {name} | {x['hosts']} ({x['gpus']:,}) | x{x['arrival_speedup']:g} | "
                     f"{x['middle_90']:.0%} / {x['whole_trace']:.0%} |")
    lines += ["", f"Estimates: {modes[0]}", "",
              "| trace | policy | jobs | avg wait | p95 wait | max wait | avg JCT | "
              "wait >1 host | GPU util | min hosts | slowdown GPU-h | p95 bsld | replay |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if r["label"] not in POLICIES or r["estimates"] != modes[0]:
            continue
        lines.append(
            f"| {r['trace']} | {r['label']} | {r['jobs']:,} | {fmt(r['avg_wait_s'])} | "
            f"{fmt(r['p95_wait_s'])} | {fmt(r['max_wait_s'])} | {fmt(r['avg_jct_s'])} | "
            f"{fmt(r['avg_wait_large_s'])} | {r['gpu_utilization']:.1%} | "
            f"{r['multi_gpu_jobs_min_hosts_frac']:.1%} | {r['slowdown_gpu_hours']:,.0f} | "
            f"{r['p95_bounded_slowdown']:.0f} | {r['wall_s']:.0f}s |")
    lines += ["", "Every estimate mode (hours; overrun stops: backfilled jobs stopped and "
              "requeued; timeouts: jobs ended by a time limit; lost: GPU-hours rerun or "
              "spent stopping, of all held):", "",
              "| trace | estimates | policy | avg wait | p95 | max wait | avg JCT | "
              "overrun stops | timeouts | lost |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in loads:
        for mode in modes:
            for r in runs:
                if (r["trace"], r["estimates"]) == (name, mode) and r["label"] in POLICIES:
                    lines.append(
                        f"| {name} | {mode} | {r['label']} | {fmt(r['avg_wait_s'])} | "
                        f"{fmt(r['p95_wait_s'])} | {fmt(r['max_wait_s'])} | "
                        f"{fmt(r['avg_jct_s'])} | {r['overrun_stops']} | {r['timeouts']} | "
                        f"{r['lost_fraction']:.3%} |")
    variants = list(dict.fromkeys(r["label"] for r in runs if "=" in r["label"]
                                  and not r["label"].startswith("reserve_after=")))
    if variants:
        lines += ["", "Variants of `backfill` (avg wait / p95 / max wait):", "",
                  "| trace | estimates | backfill | " + " | ".join(variants) + " |",
                  "|---|---|---|" + "---|" * len(variants)]
        for name in loads:
            for mode in modes:
                by = {r["label"]: r for r in runs if (r["trace"], r["estimates"]) ==
                      (name, mode)}
                lines.append(f"| {name} | {mode} | " + " | ".join(
                    f"{fmt(by[x]['avg_wait_s'])} / {fmt(by[x]['p95_wait_s'])} / "
                    f"{fmt(by[x]['max_wait_s'])}" for x in ["backfill", *variants]) + " |")
    keys = ("avg_jct", "avg_wait", "p95_wait", "max_wait", "max_04", "min_hosts")
    lines += ["", "Targets of the default (`backfill`) against `count`:", "",
              "| trace | estimates | avg JCT < count | avg wait <= count | p95 <= count | "
              "max wait <= count | max <= 0.4x count | min hosts 100 % |",
              "|---|---|---|---|---|---|---|---|"]
    for name in loads:
        for mode in modes:
            t = targets(runs, name, mode)
            lines.append(f"| {name} | {mode} | " + " | ".join(
                "yes" if t[k] else "**no**" for k in keys) + " |")
    labels = list(dict.fromkeys(r["label"] for r in runs
                                if r["label"].startswith("reserve_after=")))
    if labels:
        lines += ["", f"The knob: `reserve_after` ({modes[0]}; avg wait / p95 / max wait):",
                  "", "| trace | count | " + " | ".join(x.split("=")[1] for x in labels) + " |",
                  "|---|---|" + "---|" * len(labels)]
        for name in loads:
            by = {r["label"]: r for r in runs if r["trace"] == name
                  and r["estimates"] == modes[0]}
            cells = [f"{fmt(by[x]['avg_wait_s'])} / {fmt(by[x]['p95_wait_s'])} / "
                     f"{fmt(by[x]['max_wait_s'])}" for x in ["count", *labels]]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_curve(runs: list[dict], path: Path, name: str) -> None:
    """Average against maximum wait, one point per reserve_after, count for reference."""
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    _draw_curve(ax, runs, name)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(runs: list[dict], names: list[str], path: Path) -> None:
    """Every trace's curve in one figure (the one docs/queue-policy.md shows)."""
    plt = _pyplot()
    if plt is None or not names:
        return
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        _draw_curve(ax, [r for r in runs if r["trace"] == name], name)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _draw_curve(ax, runs: list[dict], name: str) -> None:
    curve = [r for r in runs if r["label"].startswith("reserve_after=")]
    xs = [r["max_wait_s"] / 3600 for r in curve]
    ys = [r["avg_wait_s"] / 3600 for r in curve]
    ax.plot(xs, ys, "o-", label="backfill, by reserve_after")
    for r in runs:
        if r["label"] == "backfill":
            ax.plot([r["max_wait_s"] / 3600], [r["avg_wait_s"] / 3600], "*", ms=12,
                    color="C2", label="backfill (default)")
    for r, x, y in zip(curve, xs, ys, strict=True):
        ax.annotate(r["label"].split("=")[1], (x, y), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    for r in runs:
        if r["label"] == "count":
            ax.plot([r["max_wait_s"] / 3600], [r["avg_wait_s"] / 3600], "s", color="C3",
                    label="count")
            ax.axvline(0.4 * r["max_wait_s"] / 3600, color="C3", ls=":", lw=1,
                       label="0.4x count's max wait")
            ax.axhline(r["avg_wait_s"] / 3600, color="C3", ls="--", lw=1,
                       label="count's avg wait")
    ax.set_xlabel("max wait (h)")
    ax.set_ylabel("avg wait (h)")
    ax.set_title(name, fontsize=10)


if __name__ == "__main__":
    sys.exit(main())
