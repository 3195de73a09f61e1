"""`airflow-gpu demo`: three teams share the built-in demo cluster through a running
Airflow (scheduler with LocalExecutor, triggerer, dag-processor, API server) and the
scheduler-core, with local processes for replicas: no GPU, no Docker. demo_run.py runs
the story; `dag_test` below runs one DAG with `dag.test()` (the e2e tests use it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

RESULT = "DAG-RESULT "


def dag_test(path: str, dag_id: str, conf: str = "{}") -> int:
    """Run one DAG with `dag.test()` in this process; the last line printed is
    `DAG-RESULT {"state", "tasks": {task: state}, "returned": {task: XCom}}`."""
    spec = importlib.util.spec_from_file_location("dag_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = next(v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id)
    run = dag.test(run_conf=json.loads(conf))
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print(RESULT + json.dumps({"state": str(run.state), "tasks": states,
                               "returned": _returned(dag_id, run.run_id)}, default=str),
          flush=True)
    return 0


def _returned(dag_id: str, run_id: str) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        rows = s.scalars(select(XComModel).where(XComModel.dag_id == dag_id,
                                                 XComModel.run_id == run_id,
                                                 XComModel.key == "return_value"))
        return {r.task_id: XComModel.deserialize_value(r) for r in rows}


def run_demo(args: argparse.Namespace) -> int:
    from .scheduler_core.errors import InputError

    if importlib.util.find_spec("airflow") is None:
        raise InputError("the demo runs Apache Airflow, which is not installed here: "
                         "pip install 'airflow-provider-gpu[airflow]' (make demo does)")
    if args.speed <= 0:
        raise InputError(f"--speed: {args.speed} is not a positive factor; give e.g. 1 "
                         "(the default) or 2 for replicas that run twice as long")
    from rich.console import Console

    from . import demo_run

    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    return demo_run.run(args, console)


def add_command(sub) -> None:
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dag-test"]:
        sys.exit(dag_test(*sys.argv[2:]))
    sys.exit("usage: python -m airflow_gpu.demo --dag-test DAG_FILE DAG_ID [CONF_JSON]")
