"""The `airflow-gpu` command."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from .scheduler_core.errors import InputError
from .scheduler_core.units import format_duration, format_size

EXIT_INPUT = 2


def _cmd_plan(args: argparse.Namespace) -> int:
    from .scheduler_core.cluster import load_cluster
    from .scheduler_core.jobclasses import resolve
    from .scheduler_core.jobspec import load_jobs
    from .scheduler_core.planner import plan
    from .scheduler_core.plugins import default_registry
    from .scheduler_core.state import ClusterState

    cluster = load_cluster(args.cluster)
    jobs = load_jobs(args.jobs)
    reg = default_registry()
    for job in jobs:  # report class errors against the file before planning
        resolve(job, reg.job_classes, args.jobs)
    result = plan(ClusterState(cluster), jobs, reg)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_plan(result, cluster.name)
    return 0


def _console() -> Console:
    console = Console()
    if not console.is_terminal:  # pipes and CI logs: wide enough that hosts and cpus fit
        console.width = max(console.width, 160)
    return console


def _print_plan(result, cluster_name: str) -> None:
    console = _console()
    t = Table(title=f"Admitted on {cluster_name}", title_justify="left")
    for col in ("job", "role", "#", "host", "GPUs", "CPUs", "NUMA", "memory", "NICs"):
        t.add_column(col)
    from .scheduler_core.topology import format_cpulist

    for job, placed in result.admitted:
        for k, a in enumerate(placed.allocations):
            t.add_row(job.name if k == 0 else "", a.role, str(a.index), a.host.name,
                      ",".join(map(str, a.gpus)) or "-", format_cpulist(a.cpus),
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


def _cmd_models(args: argparse.Namespace) -> int:
    from .scheduler_core.hosttype import host_type
    from .scheduler_core.topology import builtin_model_names, load_topology

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-gpu", description="GPU-aware workload management for Airflow on DGX.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="decide what would start now on an idle cluster")
    p.add_argument("--cluster", default="example",
                   help="cluster file, or a built-in cluster name (default: example)")
    p.add_argument("--jobs", required=True, help="job file (YAML or JSON with jobs: [...])")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)
    m = sub.add_parser("models", help="list the built-in DGX host models")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=_cmd_models)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
