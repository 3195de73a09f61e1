"""`airflow-gpu demo`: the example pipeline as a real Airflow run on a simulated cluster.

It starts the scheduler-core (SQLite, the built-in `demo` cluster: four DGX hosts under two
switches), migrates a throw-away Airflow home, runs `dags_examples/gpu_training_pipeline.py`
with `dag.test()` and the local-process runner (every replica prints the GPUs, cores and
NUMA node it was given), then prints the placements and the outcome. No GPU, no Docker.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

EXAMPLE = Path(__file__).resolve().parents[2] / "dags_examples" / "gpu_training_pipeline.py"
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


def free_port() -> int:
    """A free loopback port (the demo's and the tests' servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "airflow_gpu.cli", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .scheduler_core.errors import InputError

    if importlib.util.find_spec("airflow") is None:
        raise InputError("the demo runs Apache Airflow, which is not installed here: "
                         "pip install 'airflow-provider-gpu[airflow]' (make demo does)")
    if not Path(args.dag_file).is_file():
        raise InputError(f"--dag-file: {args.dag_file} does not exist; point it at "
                         "dags_examples/gpu_training_pipeline.py of a source checkout")

    console = Console(width=None if sys.stdout.isatty() else 120)
    work = Path(tempfile.mkdtemp(prefix="airflow-gpu-demo-"))
    db, port = f"sqlite:///{work}/scheduler.db", free_port()
    url = f"http://127.0.0.1:{port}"
    console.print(f"[bold]scheduler-core[/] on {url} (cluster {args.cluster!r}, {db})")
    server = subprocess.Popen(
        [sys.executable, "-m", "airflow_gpu.cli", "server", "--db", db, "--create",
         "--cluster", args.cluster, "--port", str(port), "--interval", "0.5",
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=open(work / "scheduler.log", "w"))  # noqa: SIM115
    try:
        _wait_healthy(url, server)
        token = _cli("token", "create", "--team", "vision", "--db", db).splitlines()[-1]
        home = work / "airflow"
        env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__CORE__DAGS_FOLDER": str(Path(args.dag_file).resolve().parent),
               "AIRFLOW_GPU_EXAMPLE_RUNNER": "local", "AIRFLOW_GPU_EXAMPLE_WORK": "sleep 1",
               # every simulated host is this machine: the local runner may start them all
               "AIRFLOW__GPU_SCHEDULER__LOCAL_HOST": "*",
               "AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT": json.dumps({
                   "conn_type": "gpu_scheduler", "host": "127.0.0.1", "port": port,
                   "password": token})}
        console.print(f"[bold]Airflow[/] home {home}: migrating the metadata database")
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env,
                       check=True, capture_output=True)
        console.print(f"[bold]dag.test()[/] {args.dag_file} (full log: {work}/airflow.log)\n"
                      "  replicas run as local processes; the hosts are simulated "
                      "([gpu_scheduler] local_host = *: every host is this machine), so CPU "
                      "binding and cgroups apply only where this machine has the CPUs "
                      "(warnings in the log)")
        result = _run_pipeline(args.dag_file, args.dag_id, env, work / "airflow.log", console)
        _print_placements(console, url, token, Table)
        ok = result.get("state") == "success"
        console.print(f"[bold]outcome:[/] DAG run {result.get('state')}; tasks "
                      + ", ".join(f"{t} {s}" for t, s in result.get("tasks", {}).items()),
                      style="green" if ok else "red")
        return 0 if ok else 1
    finally:
        server.terminate()
        server.wait(10)


def _wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit("the scheduler-core did not start; see its log")
        try:
            httpx.get(f"{url}/healthz", timeout=2).raise_for_status()
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the scheduler-core did not answer within 60 s")


def _run_pipeline(dag_file: str, dag_id: str, env: dict, log: Path, console) -> dict:
    """dag.test() in a child process; show what the replicas say, keep the rest in a file."""
    proc = subprocess.Popen([sys.executable, "-m", "airflow_gpu.demo", "--dag-test",
                             dag_file, dag_id], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    result: dict = {}
    with open(log, "w") as out:
        for line in proc.stdout:
            out.write(line)
            if line.startswith(RESULT):
                result = json.loads(line.removeprefix(RESULT))
            elif "[DAG TEST] starting task_id=" in line:
                console.print(f"[bold cyan]task {line.split('task_id=')[1].split()[0]}[/]")
            elif any(k in line for k in ("waiting for GPUs", " granted ", "] exited with",
                                         " on dgx-", "Task failed", "Error")):
                console.print("  " + _message(line), highlight=False, markup=False)
    proc.wait()
    if not result:
        console.print(f"[red]dag.test() did not finish[/]; the end of {log}:\n"
                      + "".join(log.read_text().splitlines(True)[-30:]), highlight=False)
    return result


def _message(line: str) -> str:
    """The log record's message, without the timestamp and logger columns."""
    text = line.split("] ", 1)[1] if "] " in line else line
    return text.split(" [airflow.", 1)[0].strip()


def _print_placements(console, url: str, token: str, Table) -> None:
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
    table = Table(title="Placements", title_justify="left")
    for col in ("job", "state", "replica", "host", "GPUs", "CPUs", "NUMA", "NICs"):
        table.add_column(col)
    from .scheduler_core.engine.topology import format_cpulist

    for j in http.get("/api/v1/jobs").json():
        job = http.get(f"/api/v1/jobs/{j['id']}").json()
        for r in job["replicas"]:
            table.add_row(job["name"].split(".", 1)[-1], job["state"],
                          f"{r['role']}-{r['index']}", r["host"],
                          ",".join(map(str, r["gpus"])) or "-", format_cpulist(r["cpus"]),
                          ",".join(r["memory_by_numa"]), ",".join(r["nics"]) or "-")
    console.print(table)


def add_command(sub) -> None:
    d = sub.add_parser("demo", help="run the example pipeline through Airflow on a "
                       "simulated DGX cluster (local processes, no GPU needed)")
    d.add_argument("--cluster", default="demo", help="cluster file or built-in name")
    d.add_argument("--dag-file", default=str(EXAMPLE))
    d.add_argument("--dag-id", default="gpu_training_pipeline")
    d.set_defaults(func=run_demo)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dag-test"]:
        sys.exit(dag_test(*sys.argv[2:]))
    sys.exit("usage: python -m airflow_gpu.demo --dag-test DAG_FILE DAG_ID [CONF_JSON]")
