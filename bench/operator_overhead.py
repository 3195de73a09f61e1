"""What the GPU operators add to the same work on a free cluster: GpuDockerOperator against
the Docker provider's DockerOperator (a busybox container running `true`), and
GpuBashOperator (the local runner) against the stock BashOperator (`true`), in real
Airflow (`dag.test()`, the tasks one after another) with a real `airflow-gpu server`
(SQLite, two simulated hosts modelled on this machine, a pass every 2 s and at once after
each submit). Needs Docker with the test image (scripts/ensure-docker.sh).

    .venv/bin/python bench/operator_overhead.py [--rounds 10] \
        [--out bench/results/operator_overhead.json]

Per operator the median task duration (Airflow's start and end of each task instance);
the GPU operator's is the submit, the admission (one long poll), the start confirmation,
the lease heartbeats and the finish on top of the same container or process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import IMAGE, Scheduler, airflow_env  # noqa: E402

DAG = '''
from airflow.providers.docker.operators.docker import DockerOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.operators.docker import GpuDockerOperator

with DAG("overhead", schedule=None, catchup=False) as dag:
    last = None
    for i in range({rounds}):
        tasks = [
            GpuDockerOperator(task_id=f"gpu_docker_{{i}}", image="{image}", command="true",
                              gpus=1, cpus=1, memory="64MiB", gpu_mode="env",
                              network_mode="none", job_class="validation"),
            DockerOperator(task_id=f"docker_{{i}}", image="{image}", command="true",
                           network_mode="none", auto_remove="success", mount_tmp_dir=False),
            GpuBashOperator(task_id=f"gpu_bash_{{i}}", bash_command="true", gpus=1, cpus=1,
                            memory="64MiB", job_class="validation"),
            BashOperator(task_id=f"bash_{{i}}", bash_command="true"),
        ]
        for t in tasks:
            if last is not None:
                last >> t
            last = t
'''

RUN = '''
import json, sys
sys.path.insert(0, sys.argv[1])
from overhead import dag
run = dag.test()
print("DURATIONS " + json.dumps({ti.task_id: (ti.end_date - ti.start_date).total_seconds()
                                 for ti in run.get_task_instances()
                                 if ti.start_date and ti.end_date}))
print("STATES " + json.dumps({ti.task_id: str(ti.state) for ti in run.get_task_instances()}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path,
                    default=ROOT / "bench" / "results" / "operator_overhead.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="overhead-"))
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "overhead.py").write_text(DAG.format(rounds=args.rounds, image=IMAGE))
    env = airflow_env(tmp / "airflow", AIRFLOW__CORE__DAGS_FOLDER=str(dags))
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   capture_output=True, timeout=600)
    scheduler = Scheduler(tmp, lease_ttl=60, args=("--interval", "2"))
    try:
        env["AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT"] = scheduler.connection()
        out = subprocess.run([sys.executable, "-c", RUN, str(dags)], env=env,
                             capture_output=True, text=True, timeout=1200)
    finally:
        scheduler.stop()
    found = {k: json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines()
             for k in ("DURATIONS", "STATES") if line.startswith(k + " ")}
    if "DURATIONS" not in found:
        raise SystemExit(f"dag.test() failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    failed = {t: s for t, s in found["STATES"].items() if "success" not in s}
    if failed:
        raise SystemExit(f"tasks did not succeed: {failed}\n{out.stdout[-3000:]}")
    durations = found["DURATIONS"]

    def median(prefix: str) -> float:
        return statistics.median(v for k, v in durations.items()
                                 if k.rsplit("_", 1)[0] == prefix)

    result = {"benchmark": "GPU operators against the stock operators, free cluster",
              "when": datetime.now(UTC).isoformat(timespec="seconds"),
              "cpus": os.cpu_count(), "rounds": args.rounds, "target_added_s": 0.1,
              "median_s": {k: round(median(k), 3)
                           for k in ("gpu_docker", "docker", "gpu_bash", "bash")}}
    m = result["median_s"]
    result["added_s"] = {"docker": round(m["gpu_docker"] - m["docker"], 3),
                         "local process": round(m["gpu_bash"] - m["bash"], 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"median task: GpuDockerOperator {m['gpu_docker']} s, DockerOperator "
          f"{m['docker']} s (+{result['added_s']['docker']} s); GpuBashOperator "
          f"{m['gpu_bash']} s, BashOperator {m['bash']} s "
          f"(+{result['added_s']['local process']} s); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
