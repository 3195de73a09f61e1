"""`airflow-gpu demo`: three teams share the built-in demo cluster through a running
Airflow (scheduler with LocalExecutor, triggerer, dag-processor, API server) and the
scheduler-core, with local processes for replicas: no GPU, no Docker. demo/run.py runs
the story."""

from __future__ import annotations

import argparse
import importlib.util
import sys


def run_demo(args: argparse.Namespace) -> int:
    from ...scheduler_core.errors import InputError

    if importlib.util.find_spec("airflow") is None:
        raise InputError("the demo runs Apache Airflow, which is not installed here: "
                         "pip install 'airflow-provider-gpu[airflow]' (make demo does)")
    if args.speed <= 0:
        raise InputError(f"--speed: {args.speed} is not a positive factor; give e.g. 1 "
                         "(the default) or 2 for replicas that run twice as long")
    from rich.console import Console

    from ...demo import run as demo_run

    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    return demo_run.run(args, console)


def add_commands(sub) -> None:
    d = sub.add_parser("demo", help="three teams share a simulated DGX cluster through a "
                       "running Airflow: deferral, backfill and priority, then a timeline "
                       "(local processes, no GPU or Docker needed)")
    d.add_argument("--out", default="demo-output", help="folder for demo-story.json and "
                   "demo-timeline.png (default ./demo-output)")
    d.add_argument("--keep", action="store_true", help="keep the whole stack (and the "
                   "Airflow UI with its GPU pages) up after the story, until Ctrl-C")
    d.add_argument("--speed", type=float, default=1.0, help="factor on how long the "
                   "replicas run (default 1)")
    d.set_defaults(func=run_demo)
