"""NVLink-domain-aware placement against placement blind to the domains, on GB200 NVL72.

Run it directly:

    .venv/bin/python bench/nvlink_domain.py [--trace itp-cluster03] [--load 0.9]
                                            [--clusters gb200-nvl72,examples/...]
                                            [--limit N] [--locality-slowdown 1.0,1.1,1.3]
                                            [--out bench/results/nvlink_domain]

Clusters (144 GPUs each, GB200 compute trays of 4 GPUs):
- `gb200-nvl72` (built-in): two racks of 18 trays, each rack one 72-GPU NVLink domain
  and one leaf switch.
- `examples/cluster-gb200-nvl36x2.yaml`: four racks of 9 trays, each with its own leaf
  switch; each NVLink domain spans two racks (NVL36x2).

The trace's arrivals are slowed down or sped up so that its offered load is `--load` (the
GPU-hours submitted in the span that holds the middle 90 % of the work, over the
cluster's GPU-hours in that span, as bench/replay.py measures it).

Both replays of a cluster run the default policy (`backfill`) on the same hardware and the
same slowdown model: a gang inside one NVLink domain runs at the one-host factor, across
domains at the one-switch or across-switches factor (tier_of_hosts). `aware` schedules on
the cluster file as it is; `blind` on the same hosts with their `nvlink_domain` left out
(a scheduler that knows racks and switches but not NVLink domains), while its jobs still
run, and are slowed down, on the real domains (SimOptions.true_cluster).

Writes `nvlink_domain.json` and `nvlink_domain.md` under `--out` (git-ignored) and prints
the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

import airflow_gpu
from airflow_gpu.scheduler_core.engine.cluster import (
    Cluster,
    Host,
    builtin_cluster_path,
    load_cluster,
)
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob, load_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import offered_load  # noqa: E402  (a sibling script, not a package)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "nvlink_domain"
CLUSTERS = "gb200-nvl72," + str(Path(__file__).resolve().parents[1] / "examples"
                                / "cluster-gb200-nvl36x2.yaml")


def blind(cluster: Cluster) -> Cluster:
    """The same hosts with no NVLink domain: what a domain-blind scheduler sees."""
    return Cluster(f"{cluster.name}-blind", [
        Host(h.index, h.name, h.type, h.rack, h.switch, h.docker_url, dict(h.labels),
             h.address, None) for h in cluster.hosts])


def scaled(trace: list[TraceJob], gpus: int, load: float) -> tuple[list[TraceJob], float]:
    """The trace with its arrivals scaled so that its middle-90 % offered load is `load`."""
    factor = offered_load(trace, gpus)["middle_90"] / load
    return [dataclasses.replace(t, submit=t.submit * factor) for t in trace], factor


def run(label: str, sched_cluster: Cluster, real: Cluster, trace: list[TraceJob],
        slowdown: tuple[float, float, float]) -> dict:
    domain_of = {h.name: h.nvlink_domain for h in real.hosts}
    gangs = {"multi_host": 0, "in_one_domain": 0}

    def observe(_sched, done) -> None:
        for _job, placed in done.started:
            hosts = {a.host.name for a in placed.allocations}
            if len(hosts) > 1:
                gangs["multi_host"] += 1
                domains = {domain_of[h] for h in hosts}
                gangs["in_one_domain"] += len(domains) == 1 and None not in domains

    policy = PolicyConfig(locality_slowdown=slowdown)
    res = simulate(sched_cluster, trace, SimOptions(policy, slowdown, true_cluster=real),
                   observe=observe)
    m = res.metrics()
    return {"label": label, **m, **gangs,
            "in_one_domain_frac": (gangs["in_one_domain"] / gangs["multi_host"]
                                   if gangs["multi_host"] else 1.0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="itp-cluster03", help="a trace of ../shared/traces")
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--clusters", default=CLUSTERS,
                    help="comma-separated cluster files or built-in names, with "
                    "nvlink_domain on their hosts")
    ap.add_argument("--load", type=float, default=0.9, help="offered load to scale to")
    ap.add_argument("--limit", type=int, help="replay only the first N jobs")
    ap.add_argument("--locality-slowdown", default="1.0,1.1,1.3",
                    help="factors for one host or NVLink domain, one switch, across switches")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    slowdown = tuple(float(v) for v in args.locality_slowdown.split(","))
    raw = load_trace(args.traces / f"{args.trace}.csv", args.limit)
    runs, sizes = [], {}
    for name in args.clusters.split(","):
        cluster = load_cluster(builtin_cluster_path(name) or name)
        if not cluster.nvlink_domains:
            ap.error(f"--clusters: {name!r} has no host with an nvlink_domain; give a "
                     "cluster file whose hosts name their NVLink domain")
        trace, factor = scaled([t for t in raw if t.gpus <= cluster.total_gpus],
                               cluster.total_gpus, args.load)
        sizes[cluster.name] = {
            "gpus": cluster.total_gpus, "hosts": len(cluster.hosts), "racks": len(cluster.racks),
            "domains": {k: len(v) for k, v in cluster.nvlink_domains.items()},
            "jobs_over_cluster_size": sum(t.gpus > cluster.total_gpus for t in raw),
            "arrival_time_factor": round(factor, 3),
            "offered_load": offered_load(trace, cluster.total_gpus)}
        for label, seen in (("aware", cluster), ("blind", blind(cluster))):
            r = {**run(label, seen, cluster, trace, slowdown), "cluster": cluster.name}
            print(f"{cluster.name:14s} {label:6s} avg wait {r['avg_wait_s'] / 3600:6.2f}h  "
                  f"avg JCT {r['avg_jct_s'] / 3600:6.2f}h  gangs in one domain "
                  f"{r['in_one_domain_frac']:.0%}  replay {r['wall_s']:.1f}s", flush=True)
            runs.append(r)
    report = {
        "benchmark": "NVLink domain placement", "version": airflow_gpu.__version__,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "machine": platform.machine(),
        "trace": args.trace, "limit": args.limit, "load": args.load,
        "locality_slowdown": slowdown, "clusters": sizes, "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nvlink_domain.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (args.out / "nvlink_domain.md").write_text(text)
    print(text)
    print(f"written to {args.out}")
    return 0


def markdown(report: dict) -> str:
    def h(s: float) -> str:
        return f"{s / 3600:.2f}h"

    lines = [f"Trace {report['trace']}, arrivals scaled to {report['load']:.0%} offered load; "
             f"slowdown (one host or NVLink domain, one switch, across switches) "
             f"{tuple(report['locality_slowdown'])}", "",
             "| cluster | trays | racks | NVLink domains | arrival times | offered load "
             "(middle 90 % / whole) |", "|---|---|---|---|---|---|"]
    for name, x in report["clusters"].items():
        lo = x["offered_load"]
        lines.append(f"| {name} | {x['hosts']} | {x['racks']} | {len(x['domains'])} x "
                     f"{max(x['domains'].values())} trays | x{x['arrival_time_factor']:g} | "
                     f"{lo['middle_90']:.0%} / {lo['whole_trace']:.0%} |")
    lines += ["", "| cluster | placement | jobs | avg wait | p95 wait | avg JCT | makespan | "
              "GPU util | multi-host gangs | in one domain | slowdown GPU-h |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(
            f"| {r['cluster']} | {r['label']} | {r['jobs']:,} | {h(r['avg_wait_s'])} | "
            f"{h(r['p95_wait_s'])} | {h(r['avg_jct_s'])} | {h(r['makespan_s'])} | "
            f"{r['gpu_utilization']:.1%} | {r['multi_host']:,} | "
            f"{r['in_one_domain_frac']:.1%} | {r.get('slowdown_gpu_hours', 0):,.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
