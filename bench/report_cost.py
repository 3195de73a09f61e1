"""The cost of one node agent heartbeat at the service, with and without accounting work:
an 8-GPU host's report when no job holds its GPUs (health and utilization only), when
one one-GPU job does and when eight do (each sample also attributed and integrated, the
jobs' series and the idle policy updated). Through the real app and store, on SQLite
and, where it answers, PostgreSQL (127.0.0.1:5432, database test).

    .venv/bin/python bench/report_cost.py [--reports 300] [--repeat 3]
        [--out bench/results/report.json]

Each report is sent to the app as the server hands it a request (ASGI, no HTTP client),
so what is timed is the service's share: the middleware, the body's validation, the
route and the database work. Per report: the SQL statements sent (every engine), the
wall time and the CPU time of this process (the database server's own CPU is not in it);
from the CPU time, the share of one core that 1,000 hosts reporting every 10 s take.
Then the same reports through `Service.report_gpus` alone, in the calling thread: its
CPU time is the part the report's own work takes (the rest is the web stack's, and the
hops between its threads).
The machine may be shared: each case runs `--repeat` times on a fresh database and the
run with the least CPU per report is kept.

Results go to `bench/results/report.json` (git-ignored) and a short table is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_gpu.scheduler_core.api.app import create_app  # noqa: E402
from airflow_gpu.scheduler_core.policy.config import PolicyConfig  # noqa: E402
from airflow_gpu.scheduler_core.service.auth import create_token  # noqa: E402
from airflow_gpu.scheduler_core.service.common import Principal  # noqa: E402
from airflow_gpu.scheduler_core.service.core import Service, Settings  # noqa: E402
from tests.helpers import make_cluster  # noqa: E402

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
HOSTS, INTERVAL = 1000, 10.0       # the fleet the share of a core is given for
WARM = 20                          # the first reports warm the caches: not counted
CASES = (("no job on the host", 0, False), ("1 job: accounting + idle policy", 1, True),
         ("8 jobs: accounting", 8, False), ("8 jobs: accounting + idle policy", 8, True))

_sent = [0]        # statements sent, by every engine (counted while main runs)


def _count(conn, cursor, statement, params, context, executemany):
    _sent[0] += 1


def _body(k: int) -> bytes:
    return json.dumps({"gpus": [
        {"index": g, "healthy": True, "utilization_gpu": float(k % 90),
         "memory_used_bytes": 2**30 * g, "power_watts": 300.0, "energy_joules": 1000.0 * k}
        for g in range(8)]}).encode()


async def _send(app, path: str, token: str, body: bytes) -> int:
    """One POST to the app, as the server hands it over; its status."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 40000),
             "server": ("127.0.0.1", 8080),
             "headers": [(b"host", b"sched"), (b"authorization", f"Bearer {token}".encode()),
                         (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    status = []

    async def receive():
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    return status[0]


def measure(db_url: str, reports: int, jobs: int, idle_policy: bool) -> dict[str, list]:
    policy = PolicyConfig.model_validate({"idle": {"after": 3600}} if idle_policy else {})
    svc = Service(Settings(db_url, make_cluster(
        {"name": "dgx-1", "model": "dgx-a100", "rack": "r", "switch": "s"}), policy))
    app = create_app(svc, run_loop=False)
    admin, ops = create_token(svc.sessions, "ops", admin=True), Principal("ops", admin=True)
    team = {"Authorization": f"Bearer {create_token(svc.sessions, 'vision')}"}
    bodies = [_body(k) for k in range(reports)]

    async def drive() -> dict[str, list]:
        out: dict[str, list] = {"wall": [], "cpu": [], "statements": [], "domain": []}
        for body in bodies:
            sent, t0, c0 = _sent[0], time.perf_counter(), time.process_time()
            status = await _send(app, "/api/v1/hosts/dgx-1/report", admin, body)
            out["cpu"].append(time.process_time() - c0)
            out["wall"].append(time.perf_counter() - t0)
            out["statements"].append(_sent[0] - sent)
            assert status == 200, status
        for body in bodies:     # the service's method alone, in this thread
            gpus = json.loads(body)["gpus"]
            c0 = time.thread_time()
            svc.report_gpus("dgx-1", ops, gpus)
            out["domain"].append(time.thread_time() - c0)
        return {k: v[WARM:] for k, v in out.items()}

    with TestClient(app) as c:
        ids = [c.post("/api/v1/jobs", headers=team, json={"spec": {
            "name": f"j{i}", "roles": [{"name": "w", "gpus": 1}]}}).json()["id"]
            for i in range(jobs)]
        app.state.loop.tick()
        for j in ids:
            c.post(f"/api/v1/jobs/{j}/heartbeat", headers=team)
        got = c.portal.call(drive)       # on the app's own event loop
    svc.engine.dispose()
    return got


class Databases:
    """A fresh database per case: SQLite files, PostgreSQL schemas (dropped at the end)."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.schemas: list[str] = []
        try:
            with create_engine(PG).connect():
                self.pg = True
        except Exception as exc:      # no PostgreSQL here: SQLite only
            print(f"postgresql skipped: {exc}", file=sys.stderr)
            self.pg = False

    def kinds(self) -> list[str]:
        return ["sqlite", "postgresql"] if self.pg else ["sqlite"]

    def fresh(self, kind: str) -> str:
        name = f"b_{uuid.uuid4().hex[:10]}"
        if kind == "sqlite":
            return f"sqlite:///{self.tmp.name}/{name}.db"
        with create_engine(PG).begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        self.schemas.append(name)
        return f"{PG}?options=-csearch_path%3D{name}"

    def close(self) -> None:
        for name in self.schemas:
            with create_engine(PG).begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        self.tmp.cleanup()


def _ms(xs: list[float], q: float = 0.5) -> float:
    return round(sorted(xs)[int((len(xs) - 1) * q)] * 1000, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/report.json"))
    args = ap.parse_args()
    rows = []
    dbs = Databases()
    event.listen(Engine, "before_cursor_execute", _count)
    try:
        for db in dbs.kinds():
            for label, jobs, idle in CASES:
                runs = [measure(dbs.fresh(db), args.reports + WARM, jobs, idle)
                        for _ in range(args.repeat)]
                best = min(runs, key=lambda r: statistics.median(r["cpu"]))
                cpu = _ms(best["cpu"])
                rows.append({
                    "database": db, "case": label, "jobs": jobs,
                    "statements": statistics.median(best["statements"]),
                    "statements_max": max(best["statements"]),
                    "median_ms": _ms(best["wall"]), "p95_ms": _ms(best["wall"], .95),
                    "cpu_ms": cpu, "runs_cpu_ms": [_ms(r["cpu"]) for r in runs],
                    "service_call_cpu_ms": _ms(best["domain"]),
                    # reports a second x CPU seconds each
                    "core_share": round(HOSTS / INTERVAL * cpu / 1000, 3)})
                r = rows[-1]
                print(f"{db:10} {label:34} {r['statements']:3g} statements  "
                      f"{r['median_ms']:5.2f} ms (p95 {r['p95_ms']:5.2f})  CPU {cpu:4.2f} ms "
                      f"(report_gpus alone {r['service_call_cpu_ms']:4.2f})  {HOSTS} hosts "
                      f"/ {INTERVAL:g} s: {r['core_share']:.0%} of a core")
    finally:
        dbs.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"reports": args.reports, "repeat": args.repeat,
                                          "hosts": HOSTS, "interval_s": INTERVAL,
                                          "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
