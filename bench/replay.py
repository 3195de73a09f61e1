"""Replay the public GPU-cluster traces under the three policies (fifo, count, backfill).

Run it with `make bench`, or directly:

    .venv/bin/python bench/replay.py [--only philly,itp-cluster02] [--limit N]
                                     [--locality-slowdown 1.0,1.1,1.3]
                                     [--out bench/results/replay]

Clusters (8-GPU dgx-a100 hosts, 16 per leaf switch, 4 switches per rack):
Philly on 256 hosts (2,048 GPUs, a loaded cluster; see ../shared/traces/README.md),
ITP clusters 02 on 64 hosts and 08, 09 on 128 hosts (the ElasticFlow paper's sizes; at
those sizes nothing queues), and ITP cluster 02 on 16 hosts, a loaded variant.

Writes `replay.json` (every metric, the bounds, the replay wall time), `replay.md` (a
table) and PNG plots per trace (`<trace>/wait_cdf.png`, `utilization.png`,
`queue_length.png`) under `--out` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

import airflow_gpu
from airflow_gpu.scheduler_core.cluster import synthetic_cluster
from airflow_gpu.scheduler_core.policy import PolicyConfig
from airflow_gpu.scheduler_core.simplots import write_plots
from airflow_gpu.scheduler_core.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.trace import load_trace
from airflow_gpu.scheduler_core.units import format_duration

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
# trace -> hosts; "name@N" replays the trace on N hosts (a loaded variant)
SETUPS = {"philly": 256, "itp-cluster02": 64, "itp-cluster08": 128, "itp-cluster09": 128,
          "itp-cluster02@16": 16}
POLICIES = ("fifo", "count", "backfill")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "replay"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(SETUPS), help="comma-separated trace names")
    ap.add_argument("--traces", type=Path, default=TRACES, help="folder of trace CSV files")
    ap.add_argument("--limit", type=int, help="replay only the first N jobs of each trace")
    ap.add_argument("--locality-slowdown", default="1.0,1.1,1.3")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    slowdown = tuple(float(v) for v in args.locality_slowdown.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for name in args.only.split(","):
        hosts = SETUPS[name]
        cluster = synthetic_cluster(hosts, "dgx-a100")
        trace = load_trace(args.traces / f"{name.split('@')[0]}.csv", args.limit)
        results = []
        for policy in POLICIES:
            res = simulate(cluster, trace, SimOptions(PolicyConfig(mode=policy), slowdown))
            m = res.metrics()
            print(f"{name:14s} {policy:8s} jobs {m['jobs']:>7,}  avg wait "
                  f"{format_duration(m['avg_wait_s']):>10s}  replay {m['wall_s']:.1f}s",
                  flush=True)
            results.append(res)
            runs.append({"trace": name, "hosts": hosts, **m})
        write_plots(results, args.out / name, f"({name}, {cluster.name})")
    report = {
        "benchmark": "trace replay", "version": airflow_gpu.__version__,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "machine": platform.machine(),
        "locality_slowdown": slowdown, "limit": args.limit, "runs": runs,
    }
    (args.out / "replay.json").write_text(json.dumps(report, indent=2))
    (args.out / "replay.md").write_text(markdown(runs, slowdown))
    print((args.out / "replay.md").read_text())
    print(f"written to {args.out}")
    return 0


def markdown(runs: list[dict], slowdown) -> str:
    d = format_duration
    lines = [f"Locality slowdown (one host / one switch / across): {slowdown}", "",
             "| trace | GPUs | policy | jobs | avg JCT | avg wait | p95 wait | wait >1 host | "
             "GPU util | min hosts | replay |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r['trace']} | {r['total_gpus']:,} | {r['policy']} | {r['jobs']:,} | "
            f"{d(r['avg_jct_s'])} | {d(r['avg_wait_s'])} | {d(r['p95_wait_s'])} | "
            f"{d(r['avg_wait_large_s'])} | {r['gpu_utilization']:.1%} | "
            f"{r['multi_gpu_jobs_min_hosts_frac']:.1%} | "
            f"{r['wall_s']:.0f}s |")
        if r["policy"] == POLICIES[-1]:
            lines.append(f"| {r['trace']} | | lower bound | | {d(r['avg_jct_lower_bound_s'])}"
                         " | 0s | 0s | 0s | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
