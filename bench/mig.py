"""MIG for validation-heavy workloads: many short 1-GPU validation jobs next to training
gangs, with and without MIG on part of the cluster.

Run it directly (a minute or two on two cores):

    .venv/bin/python bench/mig.py [--hosts 16] [--hours 24] [--seed 1]
                                  [--validation-per-hour 100] [--burst 40]
                                  [--training-load 0.9] [--mig-slowdown 2.0]
                                  [--out bench/results/mig]

The workload (seeded, the same for every setup): training gangs of 8, 16 and 32 GPUs
(one, two and four dgx-a100 hosts; 50/30/20 %), 1-6 h long, arriving at random to offer
`--training-load` of the cluster's GPU-hours; validation jobs of one GPU and a small model
(it fits a 1g.5gb MIG device), 5-20 min on a whole GPU, `--validation-per-hour` of them
in sweeps of `--burst` submitted at once (every checkpoint of a run, say).

Setups: `no MIG` (validation asks `gpus: 1`); `MIG on N hosts`: the last N hosts have all
their GPUs in MIG mode with seven 1g.5gb devices each (the cluster file's `mig:`), and
validation asks `gpu: {mig: 1g.5gb}`. A 1g.5gb device has a seventh of the GPU's compute:
a validation job there runs `--mig-slowdown` times longer than on a whole GPU (an
assumption: small validation runs rarely keep a whole A100 busy). The MIG hosts take no
training (their GPUs are never handed out whole).

Writes `mig.json` (every figure, the scenario) and `mig.md` (the table) under `--out`
(git-ignored). Results are figures, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import airflow_gpu
from airflow_gpu.scheduler_core.engine.cluster import ClusterFile, build_cluster
from airflow_gpu.scheduler_core.errors import validate
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "mig"
HOST_GPUS = 8
GANGS = ((8, 0.5), (16, 0.3), (32, 0.2))


def workload(hosts: int, hours: float, per_hour: float, seed: int, load: float,
             burst: int) -> list[TraceJob]:
    rng = random.Random(seed)
    span = hours * 3600
    jobs: list[TraceJob] = []
    mean_gpus = sum(g * p for g, p in GANGS)
    train_rate = load * hosts * HOST_GPUS / (mean_gpus * 3.5 * 3600)   # gangs per second
    t = 0.0
    while True:
        t += rng.expovariate(train_rate)
        if t >= span:
            break
        gpus = rng.choices([g for g, _ in GANGS], [p for _, p in GANGS])[0]
        jobs.append(TraceJob(f"train-{len(jobs)}", t, rng.uniform(3600, 6 * 3600), gpus))
    t, n = 0.0, 0
    while True:       # sweeps of `burst` jobs (every checkpoint of a run, say)
        t += rng.expovariate(per_hour / burst / 3600)
        if t >= span:
            break
        for _ in range(burst):
            jobs.append(TraceJob(f"val-{n}", t, rng.uniform(300, 1200), 1, priority=10))
            n += 1
    return sorted(jobs, key=lambda j: j.submit)


def cluster(hosts: int, mig_hosts: int):
    entries = [{"name": f"dgx-{i:02d}", "model": "dgx-a100", "rack": "r1",
                "switch": f"leaf-{i // 16 + 1}"} for i in range(1, hosts + 1)]
    for e in entries[hosts - mig_hosts:]:
        e["mig"] = [{"gpus": "all", "layout": {"1g.5gb": 7}}]
    spec = validate(ClusterFile, {"cluster": f"{hosts}x dgx-a100, {mig_hosts} MIG",
                                  "hosts": entries}, "bench/mig.py")
    return build_cluster(spec, source="bench/mig.py")


def spec_of(mig: bool, slowdown: float):
    def make(t: TraceJob) -> JobSpec:
        if t.job_id.startswith("val-"):
            gpu = {"gpu": {"mig": "1g.5gb"}} if mig else {"gpus": 1}
            roles = [{"name": "val", "cpus": 4, "memory": "16GiB", **gpu}]
        else:
            n = t.gpus // HOST_GPUS
            roles = [{"name": "worker", "replicas": n, "gpus": HOST_GPUS, "cpus": 32,
                      "memory": "256GiB"}]
        return validate(JobSpec, {"name": t.job_id, "priority": t.priority,
                                  "roles": roles}, t.job_id)
    return make


def summary(records, kind: str, window: float) -> dict:
    mine = [r for r in records if r.job_id.startswith(kind)]
    done = [r for r in mine if r.end is not None]
    waits = sorted(r.start - r.submit for r in mine if r.start is not None)
    out = {"jobs": len(mine), "finished": len(done),
           "rejected": sum(1 for r in mine if r.rejected)}
    if waits:
        out.update(avg_wait_s=round(statistics.fmean(waits), 1),
                   p50_wait_s=round(waits[len(waits) // 2], 1),
                   p95_wait_s=round(waits[min(len(waits) - 1, int(0.95 * len(waits)))], 1),
                   max_wait_s=round(waits[-1], 1))
    in_window = [r for r in done if r.end <= window]
    out["finished_per_hour_in_window"] = round(len(in_window) / (window / 3600), 2)
    if done:
        out["avg_jct_s"] = round(statistics.fmean(r.end - r.submit for r in done), 1)
    return out


def run(args, mig_hosts: int, trace: list[TraceJob]) -> dict:
    c = cluster(args.hosts, mig_hosts)
    mig = mig_hosts > 0
    slow = args.mig_slowdown if mig else 1.0
    jobs = [TraceJob(t.job_id, t.submit, t.duration * slow, t.gpus, priority=t.priority)
            if t.job_id.startswith("val-") else t for t in trace]
    started = time.perf_counter()
    res = simulate(c, jobs, SimOptions(spec_of=spec_of(mig, slow)))
    window = args.hours * 3600
    return {"setup": (f"MIG on {mig_hosts} host{'s' if mig_hosts > 1 else ''}" if mig
                      else "no MIG"),
            "mig_hosts": mig_hosts, "mig_devices": sum(len(h.type.mig.slices)
                                                       for h in c.hosts if h.type.mig),
            "whole_gpus_for_training": (args.hosts - mig_hosts) * HOST_GPUS,
            "validation": summary(res.records, "val-", window),
            "training": summary(res.records, "train-", window),
            "passes": res.passes, "wall_s": round(time.perf_counter() - started, 1)}


def table(results: list[dict]) -> str:
    head = ("| setup | validation finished / h | validation wait avg / p95 | "
            "training wait avg / p95 | training JCT avg |\n|---|---|---|---|---|\n")

    def m(s):
        return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"

    rows = []
    for r in results:
        v, t = r["validation"], r["training"]
        rows.append(f"| {r['setup']} | {v['finished_per_hour_in_window']} | "
                    f"{m(v['avg_wait_s'])} / {m(v['p95_wait_s'])} | "
                    f"{m(t['avg_wait_s'])} / {m(t['p95_wait_s'])} | {m(t['avg_jct_s'])} |")
    return head + "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--validation-per-hour", type=float, default=100)
    ap.add_argument("--burst", type=int, default=40, help="validation jobs per sweep")
    ap.add_argument("--training-load", type=float, default=0.9,
                    help="GPU-hours of training offered over the cluster's")
    ap.add_argument("--mig-slowdown", type=float, default=2.0)
    ap.add_argument("--mig-hosts", default="0,1,2", help="setups: MIG hosts, comma-separated")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    trace = workload(args.hosts, args.hours, args.validation_per_hour, args.seed,
                     args.training_load, args.burst)
    results = []
    for n in (int(x) for x in args.mig_hosts.split(",")):
        results.append(run(args, n, trace))
        print(f"{results[-1]['setup']}: {json.dumps(results[-1]['validation'])}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    scenario = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    doc = {"version": airflow_gpu.__version__, "at": datetime.now(UTC).isoformat(),
           "machine": platform.platform(), "scenario": scenario,
           "jobs": {"validation": sum(t.job_id.startswith("val-") for t in trace),
                    "training": sum(t.job_id.startswith("train-") for t in trace)},
           "results": results}
    (args.out / "mig.json").write_text(json.dumps(doc, indent=1))
    (args.out / "mig.md").write_text(
        f"# MIG for validation jobs ({args.hosts} dgx-a100 hosts, {args.hours:g} h, "
        f"{args.validation_per_hour:g} validation jobs/h, MIG slowdown "
        f"{args.mig_slowdown:g}x)\n\n" + table(results))
    print(table(results))


if __name__ == "__main__":
    main()
