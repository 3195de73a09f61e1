"""`airflow-gpu plan` (what would start now on an idle cluster), `simulate` (replay a
trace through the scheduler) and `models` (the built-in host models)."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from ...scheduler_core.errors import InputError
from ...scheduler_core.units import format_duration, format_size
from ..common import console as _console
from ..common import refuse_jobs


def _cmd_plan(args: argparse.Namespace) -> int:
    """Exit 2 with one line for a file it cannot read (nothing planned); a job its class
    or the policy refuses is left out, the others planned and shown, and each refusal
    is one line on stderr (exit 2: `submit` refuses that file)."""
    from ...scheduler_core.engine.cluster import load_cluster
    from ...scheduler_core.engine.state import ClusterState
    from ...scheduler_core.jobfile import read_jobs
    from ...scheduler_core.plugins import default_registry
    from ...scheduler_core.policy.config import load_policy
    from ...scheduler_core.policy.planner import plan

    cluster = load_cluster(args.cluster)
    jobs = read_jobs(args.jobs)
    config = load_policy(args.policy_file) if args.policy_file else None
    windows = _windows(args, cluster)
    result = plan(ClusterState(cluster), jobs, default_registry(), config, windows)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_plan(result, cluster.name)
    return refuse_jobs(args.jobs, [(i, job.name, why) for i, job, why in result.refused])


def _print_plan(result, cluster_name: str) -> None:
    console = _console()
    t = Table(title=f"Admitted on {cluster_name}", title_justify="left")
    for col in ("job", "role", "#", "host", "GPUs", "CPUs", "NUMA", "memory", "NICs"):
        t.add_column(col)
    from ...scheduler_core.engine.topology import format_cpulist

    for job, placed in result.admitted:
        for k, a in enumerate(placed.allocations):
            t.add_row(job.name if k == 0 else "", a.role, str(a.index), a.host.name,
                      ",".join(map(str, a.gpus)) or "; ".join(s.label for s in a.slices)
                      or "-", format_cpulist(a.cpus),
                      ",".join(map(str, a.numa_nodes)), format_size(a.memory_bytes),
                      ",".join(a.nics) or "-")
        t.add_section()
    console.print(t)
    if result.pending:
        p = Table(title="Pending", title_justify="left")
        for col in ("job", "code", "ETA", "reason"):
            p.add_column(col, overflow="fold")
        for job, why in result.pending:
            p.add_row(job.name, why.code,
                      format_duration(why.eta) if why.eta is not None else "-", why.message)
        console.print(p)
    if result.rejected:
        r = Table(title="Rejected (can never fit this cluster)", title_justify="left")
        r.add_column("job")
        r.add_column("error", overflow="fold")
        for job, error in result.rejected:
            r.add_row(job.name, error)
        console.print(r)


def _windows(args: argparse.Namespace, cluster) -> list:
    if not args.reservations:
        return []
    from ...scheduler_core.simulation.windowfile import load_windows

    return load_windows(args.reservations, cluster)


POLICIES = ("fifo", "count", "backfill")


def _policies(text: str) -> list[str]:
    names = list(POLICIES) if text == "all" else [p.strip() for p in text.split(",")]
    for name in names:
        if name not in POLICIES:
            raise InputError(f"--policy: unknown policy {name!r}; use one of "
                             f"{', '.join(POLICIES)}, a comma-separated list, or all")
    return names


def _slowdown(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or any(not v > 0 for v in values):
        raise InputError(f"--locality-slowdown: {text!r} is not three positive numbers; "
                         "write e.g. 1.0,1.1,1.3 (one host, one switch, across switches)")
    return values  # type: ignore[return-value]


def _cmd_simulate(args: argparse.Namespace) -> int:
    from ...scheduler_core.engine.cluster import load_cluster, synthetic_cluster
    from ...scheduler_core.policy.config import PolicyConfig, load_policy
    from ...scheduler_core.simulation.estimates import parse_estimate_error, with_estimates
    from ...scheduler_core.simulation.simulator import SimOptions, simulate
    from ...scheduler_core.simulation.trace import load_trace
    from ...scheduler_core.units import parse_duration, parse_size

    if args.hosts is not None:
        cluster = synthetic_cluster(args.hosts, tuple(args.model.split(",")),
                                    args.hosts_per_switch, args.switches_per_rack)
    else:
        cluster = load_cluster(args.cluster or "example")
    names = _policies(args.policy)
    slowdown = _slowdown(args.locality_slowdown)
    base = load_policy(args.policy_file) if args.policy_file else PolicyConfig()
    if "locality_slowdown" not in base.model_fields_set:
        # the scheduler plans with the slowdown the replay simulates, unless told otherwise
        base = base.model_copy(update={"locality_slowdown": slowdown})
    try:
        memory = parse_size(args.memory_per_gpu)
    except ValueError as exc:
        raise InputError(f"--memory-per-gpu: {exc}") from None
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit: {args.limit} is not a positive number of jobs")
    try:
        checkpoint = parse_duration(args.checkpoint_interval)
    except ValueError as exc:
        raise InputError(f"--checkpoint-interval: {exc} (0: no checkpoints)") from None
    mode = parse_estimate_error(args.estimate_error)
    trace = with_estimates(load_trace(args.trace, args.limit), mode)
    windows = _windows(args, cluster)
    results = []
    for name in names:
        options = SimOptions(base.model_copy(update={"mode": name}), slowdown,
                             args.cpus_per_gpu, memory, checkpoint or None,
                             args.high_priority, windows=windows)
        results.append(simulate(cluster, trace, options))
    if args.records:
        for r in results:
            path = args.records if len(results) == 1 else _suffixed(args.records, r.policy)
            r.write_records(path)
    if args.plot:
        from ...scheduler_core.simulation.simplots import write_plots

        write_plots(results, args.plot, f"({cluster.name})")
    metrics = [r.metrics() for r in results]
    if args.json:
        print(json.dumps(metrics[0] if len(metrics) == 1 else {"results": metrics}, indent=2))
    else:
        _print_simulation(metrics, args.trace)
    return 0


def _suffixed(path: str, policy: str) -> str:
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}-{policy}{p.suffix}"))


def _print_simulation(metrics: list[dict], trace: str) -> None:
    first = metrics[0]
    t = Table(title=f"Replay of {trace} on {first['cluster']} ({first['total_gpus']} GPUs)",
              title_justify="left")
    for col in ("policy", "jobs", "avg JCT", "avg wait", "p95 wait", "max wait",
                "wait >1 host", "makespan", "GPU util", "min hosts", "replay time"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for m in metrics:
        if not m["jobs"]:
            t.add_row(m["policy"], "0", *["-"] * 9)
            continue
        t.add_row(m["policy"], f"{m['jobs']:,}", format_duration(m["avg_jct_s"]),
                  format_duration(m["avg_wait_s"]), format_duration(m["p95_wait_s"]),
                  format_duration(m["max_wait_s"]),
                  format_duration(m["avg_wait_large_s"]), format_duration(m["makespan_s"]),
                  f"{m['gpu_utilization']:.1%}",
                  f"{m['multi_gpu_jobs_min_hosts_frac']:.1%}", f"{m['wall_s']:.1f}s")
    if "avg_jct_lower_bound_s" in first:
        t.add_section()
        t.add_row("bound", "", format_duration(first["avg_jct_lower_bound_s"]), "0s", "0s",
                  "0s", "0s", format_duration(first["makespan_lower_bound_s"]), "", "", "")
    console = _console()
    console.print(t)
    if "pipelines" in first:
        console.print(_deadline_table(metrics))
    for m in metrics:
        if m["rejected"] or m["unfinished"]:
            console.print(f"{m['policy']}: {m['rejected']} jobs rejected (can never fit), "
                          f"{m['unfinished']} never started")
        if m.get("hi_jobs"):
            console.print(f"{m['policy']}: {m['hi_jobs']:,} high-priority jobs wait "
                          f"{format_duration(m['hi_avg_wait_s'])} on average, "
                          f"{format_duration(m['hi_p95_wait_s'])} at p95")
        if m["timeouts"] or m["overrun_stops"]:
            console.print(f"{m['policy']}: {m['timeouts']:,} jobs ended at their time limit "
                          f"(timeout); {m['overrun_stops']:,} stops of backfilled jobs that "
                          "overran their estimate into a reservation (requeued, run again)")
        if m["preemptions"] or m["borrowed_jobs"]:
            console.print(f"{m['policy']}: preemptions {m['preemptions']:,}, "
                          f"{m['lost_gpu_hours']:,.1f} GPU-hours lost "
                          f"({m['lost_fraction']:.2%} of {m['gpu_hours']:,.0f}); "
                          f"{m['borrowed_jobs']:,} jobs ran on borrowed quota")


def _deadline_table(metrics: list[dict]) -> Table:
    """Pipelines against their deadlines (trace columns dag_run, upstream, deadline)."""
    t = Table(title="Deadlines (pipelines: a dag_run, or a job with a deadline alone)",
              title_justify="left")
    for col in ("policy", "pipelines", "met", "late p50", "late p95", "infeasible",
                "missed, avoidable", "background jobs", "background avg wait",
                "background avg JCT"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for m in metrics:
        if "pipelines" not in m:
            continue
        t.add_row(m["policy"], f"{m['pipelines']:,}",
                  f"{m['pipelines_met']:,} ({m['pipelines_met_frac']:.1%})",
                  format_duration(m["pipelines_late_p50_s"]),
                  format_duration(m["pipelines_late_p95_s"]),
                  f"{m['pipelines_infeasible']:,}", f"{m['pipelines_missed_avoidable']:,}",
                  f"{m['background_jobs']:,}",
                  format_duration(m["background_avg_wait_s"]),
                  format_duration(m["background_avg_jct_s"]))
    return t


def _cmd_models(args: argparse.Namespace) -> int:
    from ...scheduler_core.engine.hosttype import host_type
    from ...scheduler_core.engine.topology import builtin_model_names, load_topology

    rows = []
    for name in builtin_model_names():
        t = host_type(load_topology(name))
        rows.append({"model": name, "gpus": t.n_gpus, "gpu": t.gpu_name[0],
                     "gpu_memory": format_size(t.gpu_mem[0]), "fabric": t.fabric,
                     "numa_nodes": len(t.numa_ids), "cpus": t.total_cpus,
                     "memory": format_size(t.total_mem)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="Built-in host models", title_justify="left")
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*map(str, row.values()))
    _console().print(table)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("plan", help="decide what would start now on an idle cluster")
    p.add_argument("--cluster", default="example",
                   help="cluster file, or a built-in cluster name (default: example)")
    p.add_argument("--jobs", required=True, help="job file (YAML or JSON with jobs: [...])")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)
    p.add_argument("--policy-file", help="queue policy file (weights, teams, quotas)")
    p.add_argument("--reservations", metavar="FILE", help="admins' reservations (YAML), "
                   "times from now: docs/admin-guide.md, Reservations")
    s = sub.add_parser("simulate", help="replay a job trace through the scheduler",
                       description="Replay a trace (job_id,submit_time,duration,num_gpus"
                       "[,team,priority,job_class,expected_runtime,time_limit,reservation,"
                       "dag_run,upstream,deadline]) with a virtual clock.")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--cluster", help="cluster file or built-in cluster name")
    where.add_argument("--hosts", type=int, help="a synthetic cluster of this many hosts")
    s.add_argument("--model", default="dgx-a100",
                   help="with --hosts: built-in model(s), comma-separated alternate by switch")
    s.add_argument("--hosts-per-switch", type=int, default=16)
    s.add_argument("--switches-per-rack", type=int, default=4)
    s.add_argument("--trace", required=True, help="trace CSV file")
    s.add_argument("--policy", default="backfill",
                   help="fifo | count | backfill (default), a comma-separated list, or all")
    s.add_argument("--policy-file", help="queue policy file (weights, teams, quotas)")
    s.add_argument("--reservations", metavar="FILE", help="admins' reservations (YAML), "
                   "times from the trace's start: what a maintenance window costs in waits")
    s.add_argument("--locality-slowdown", default="1.0,1.1,1.3",
                   help="runtime factor for one host (or NVLink domain), one "
                   "switch, across switches")
    s.add_argument("--limit", type=int, help="replay only the first N jobs")
    s.add_argument("--estimate-error", default="exact", metavar="MODE",
                   help="what the scheduler is told of runtimes where the trace has no "
                        "expected_runtime or time_limit column: exact (the duration), "
                        "lognormal:SIGMA (the duration x exp(SIGMA x z)) or limit:LO-HI (no "
                        "estimate; a time limit of LO-HI x the duration, rounded up to the "
                        "hour); derived from each job's id, the same every run"),
    s.add_argument("--checkpoint-interval", default="30m",
                   help="how often jobs checkpoint, where their job class does not say: "
                   "a preemption loses the work since the last one (0: no checkpoints)")
    s.add_argument("--high-priority", type=int, default=100, metavar="PRIORITY",
                   help="jobs of this priority or more are reported apart (hi_* metrics)")
    s.add_argument("--cpus-per-gpu", type=int, default=4, help="CPUs a trace job asks per GPU")
    s.add_argument("--memory-per-gpu", default="32GiB", help="memory a trace job asks per GPU")
    s.add_argument("--json", action="store_true", help="print the metrics as JSON")
    s.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR")
    s.add_argument("--records", metavar="FILE", help="write one CSV row per job into FILE")
    s.set_defaults(func=_cmd_simulate)
    m = sub.add_parser("models", help="list the built-in DGX host models")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=_cmd_models)
