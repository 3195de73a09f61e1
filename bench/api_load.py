"""Load on the service over loopback: submissions per second, with one server process and
with two on PostgreSQL (and their ratio), and the time from "GPUs free" to "job admitted",
on SQLite and on PostgreSQL.

    .venv/bin/python bench/api_load.py [--db sqlite,postgresql] [--seconds 10]
                                       [--clients 16] [--rounds 20] [--workers 1,2]
                                       [--python-client]
                                       [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test]

Each database and number of processes gets a fresh server (`airflow-gpu server`, `--workers`
uvicorn worker processes, PostgreSQL only; scheduling pass every 2 s and at once after
submits and finishes) on a 16-host dgx-a100 cluster and a fresh store. Admission latency
first: a 128-GPU job fills the cluster, a second one waits; the first is finished and the
time until the second reads `admitted` is measured, `--rounds` times; the last is finished
so the cluster is empty again. Submissions: wrk (Debian's `wrk`; `apt-get install wrk`)
keeps `--clients` keep-alive connections posting 1-GPU jobs, each with its own idempotency
key, for `--seconds`; then the jobs in the store are counted against the acknowledged
ones. Without wrk (or with `--python-client`), `--clients` Python threads post `--submits`
jobs: on two cores that client takes much of the CPU it measures. With 1 and 2 processes
measured on PostgreSQL the ratio of their submissions/s is printed and stored. Results go
to bench/results/api_load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from airflow_gpu.demo.stack import free_port

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "api_load.json"
TARGET_SUBMITS = 500.0           # PostgreSQL, one server process, 2 cores
TARGET_ADMIT_S = 1.0



def cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "airflow_gpu.cli", *args], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout.strip()


@contextmanager
def fresh_store(kind: str, pg: str, tmp: Path) -> Iterator[str]:
    """A new store at head (`db upgrade`): a SQLite file in `tmp`, or a schema of its own
    in PostgreSQL `pg`, dropped afterwards; yields its URL."""
    schema = None
    if kind == "sqlite":
        db = f"sqlite:///{tmp / f'bench-{uuid.uuid4().hex[:6]}.db'}"
    else:
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        with create_engine(pg).begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        db = f"{pg}?options=-csearch_path%3D{schema}"
    try:
        cli("db", "upgrade", "--db", db)
        yield db
    finally:
        if schema:
            with create_engine(pg).begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


class Server:
    def __init__(self, db: str, cluster: Path, workers: int = 1, log: Path = Path(os.devnull)):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_gpu.cli", "server", "--db", db, "--create",
             "--cluster", str(cluster), "--port", str(self.port), "--log-level", "warning",
             "--workers", str(workers)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(log, "w"))  # noqa: SIM115
        for _ in range(300):
            try:
                if httpx.get(f"{self.url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise SystemExit("the server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:     # a pass in flight: its figures are taken
            self.proc.kill()
            self.proc.wait()


def submit_load(url: str, token: str, total: int, clients: int) -> dict:
    errors: list[str] = []
    per_client = total // clients
    barrier = threading.Barrier(clients + 1)

    def run(k: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as c:
            barrier.wait()
            for i in range(per_client):
                r = c.post("/api/v1/jobs", json={
                    "spec": {"name": f"load-{k}-{i}", "expected_runtime": "1h",
                             "roles": [{"name": "w", "gpus": 1}]},
                    "idempotency_key": f"{k}-{i}"})
                if r.status_code != 201:
                    errors.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    n = per_client * clients
    return {"load": "python", "submits": n, "clients": clients, "seconds": round(wall, 3),
            "submits_per_s": round(n / wall, 1), "errors": len(errors),
            "first_error": errors[0] if errors else None}


WRK_SCRIPT = """
local n = 0
local threads = {}
function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end
request = function()
  n = n + 1
  local body = '{"spec": {"name": "load-' .. tid .. '-' .. n .. '", "expected_runtime": "1h", '
    .. '"roles": [{"name": "w", "gpus": 1}]}, "idempotency_key": "' .. tid .. '-' .. n .. '"}'
  return wrk.format("POST", "/api/v1/jobs", {["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. os.getenv("AIRFLOW_GPU_TOKEN")}, body)
end
"""


def submit_load_wrk(url: str, token: str, seconds: int, clients: int, db: str) -> dict:
    """wrk (C, two threads) as the load: a Python client on the same two cores would
    measure itself more than the service."""
    script = Path(tempfile.mkdtemp()) / "submit.lua"
    script.write_text(WRK_SCRIPT)
    out = subprocess.run(["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "-s", str(script),
                          url], capture_output=True, text=True, check=True,
                         env={**os.environ, "AIRFLOW_GPU_TOKEN": token}).stdout
    total = int(re.search(r"(\d+) requests in", out).group(1))
    wall = float(re.search(r"requests in ([\d.]+)s", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    stored = load_jobs(db)               # every acknowledged job is in the store
    errors = int(bad.group(1)) if bad else 0
    # wrk stops with a request in flight per connection: those may be stored, uncounted
    lost = max(0, total - errors - stored)
    return {"load": "wrk", "submits": total, "stored": stored, "clients": clients,
            "seconds": wall, "submits_per_s": round((total - errors) / wall, 1),
            "errors": errors, "lost": lost, "first_error": None}


def load_jobs(db: str) -> int:
    """The load's jobs in the store (read there: the API lists at most 10,000)."""
    engine = create_engine(db)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM jobs WHERE name LIKE 'load-%'")
                                ).scalar_one()
    finally:
        engine.dispose()


def admission_latency(url: str, token: str, rounds: int) -> dict:
    big = {"name": "fill", "expected_runtime": "1h",
           "roles": [{"name": "w", "replicas": 16, "gpus": 8}]}
    lat = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as c:
        holder = c.post("/api/v1/jobs", json={"spec": big}).json()["id"]
        wait_state(c, holder, "admitted")
        for _ in range(rounds):
            nxt = c.post("/api/v1/jobs", json={"spec": big}).json()["id"]
            time.sleep(0.3)                       # let a pass see it waiting
            assert c.get(f"/api/v1/jobs/{nxt}").json()["state"] == "pending"
            c.post(f"/api/v1/jobs/{holder}/finish", json={"outcome": "succeeded"})
            t0 = time.perf_counter()              # the GPUs are free from here on
            wait_state(c, nxt, "admitted", poll=0.005)
            lat.append(time.perf_counter() - t0)
            holder = nxt
        c.post(f"/api/v1/jobs/{holder}/finish", json={"outcome": "succeeded"})  # all free
    lat.sort()
    return {"rounds": rounds, "median_s": round(statistics.median(lat), 4),
            "p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 4),
            "max_s": round(lat[-1], 4)}


def wait_state(c: httpx.Client, job_id: str, state: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + 30
    while c.get(f"/api/v1/jobs/{job_id}").json()["state"] != state:
        if time.monotonic() > deadline:
            states = Counter(j["state"] for j in c.get("/api/v1/jobs",
                                                         params={"limit": 10_000}).json())
            raise SystemExit(f"job {job_id} never became {state} (jobs: {dict(states)}; "
                             f"{c.get(f'/api/v1/jobs/{job_id}/explain').json()['reason']})")
        time.sleep(poll)


def run_one(kind: str, workers: int, args, tmp: Path, cluster: Path) -> dict:
    """One server with `workers` processes on a fresh store of `kind`: latency, then load."""
    with fresh_store(kind, args.pg, tmp) as db:
        token = cli("token", "create", "--team", "bench", "--db", db)
        server = Server(db, cluster, workers, tmp / f"server-{kind}-{workers}.log")
        try:
            admit = admission_latency(server.url, token, args.rounds)
            load = (submit_load_wrk(server.url, token, args.seconds, args.clients, db)
                    if shutil.which("wrk") and not args.python_client else
                    submit_load(server.url, token, args.submits, args.clients))
        finally:
            server.stop()
    print(f"{kind:10s} {load['submits_per_s']:8.1f} submissions/s ({workers} server "
          f"process(es), {load['clients']} {load.get('load', 'python')} "
          f"clients, {load['errors']} errors); GPUs free -> admitted: median "
          f"{admit['median_s'] * 1000:.0f} ms, p95 {admit['p95_s'] * 1000:.0f} ms, "
          f"max {admit['max_s'] * 1000:.0f} ms", flush=True)
    return {"db": kind, "workers": workers, **load, "admission": admit}


def scaling(results: list[dict]) -> dict:
    """Per database measured with 1 and 2 processes: the ratio of their submissions/s."""
    out = {}
    for kind in dict.fromkeys(r["db"] for r in results):
        rate = {r["workers"]: r["submits_per_s"] for r in results if r["db"] == kind}
        if 1 in rate and 2 in rate and rate[1]:
            out[kind] = {"submits_per_s_1": rate[1], "submits_per_s_2": rate[2],
                         "ratio_2_to_1": round(rate[2] / rate[1], 2)}
            print(f"{kind:10s} 2 server processes: {rate[2] / rate[1]:.2f}x the "
                  f"submissions/s of one ({rate[2]:.1f} vs {rate[1]:.1f})", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default="sqlite,postgresql")
    ap.add_argument("--submits", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=int, default=10, help="wrk's load duration")
    ap.add_argument("--python-client", action="store_true",
                    help="threads of httpx instead of wrk (the default when wrk is absent)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--workers", default="1,2",
                    help="server processes to measure on PostgreSQL, comma-separated "
                    "(default 1,2: also their ratio); SQLite: always 1")
    ap.add_argument("--pg", default=os.environ.get(
        "AIRFLOW_GPU_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="api-load-"))
    cluster = tmp / "cluster.yaml"
    cluster.write_text("cluster: load\nhosts:\n"
                       "  - {name: 'dgx-[01-16]', model: dgx-a100, rack: r1, switch: s1}\n")
    results = []
    for kind in args.db.split(","):
        for n in (workers if kind == "postgresql" else [1]):
            results.append(run_one(kind, n, args, tmp, cluster))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "api load", "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "targets": {"submits_per_s_postgresql": TARGET_SUBMITS,
                                            "admission_s": TARGET_ADMIT_S},
        "results": results, "scaling": scaling(results)}, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
