"""The cost of one node agent heartbeat at the service, with and without accounting work:
an 8-GPU host's report when no job holds its GPUs (health and utilization only) and when
eight one-GPU jobs hold them (each sample also attributed and integrated, the jobs'
series and the idle policy updated). Through the real app and store, on SQLite and, where
it answers, PostgreSQL (127.0.0.1:5432, database test).

    .venv/bin/python bench/report_cost.py [--reports 300] [--out bench/results/report.json]

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
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_gpu.scheduler_core.api.app import create_app  # noqa: E402
from airflow_gpu.scheduler_core.policy.config import PolicyConfig  # noqa: E402
from airflow_gpu.scheduler_core.service.auth import create_token  # noqa: E402
from airflow_gpu.scheduler_core.service.core import Service, Settings  # noqa: E402
from tests.helpers import make_cluster  # noqa: E402

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def measure(db_url: str, reports: int, jobs: int, idle_policy: bool) -> list[float]:
    policy = PolicyConfig.model_validate({"idle": {"after": 3600}} if idle_policy else {})
    svc = Service(Settings(db_url, make_cluster(
        {"name": "dgx-1", "model": "dgx-a100", "rack": "r", "switch": "s"}), policy))
    app = create_app(svc, run_loop=False)
    admin = {"Authorization": f"Bearer {create_token(svc.sessions, 'ops', admin=True)}"}
    team = {"Authorization": f"Bearer {create_token(svc.sessions, 'vision')}"}
    out = []
    with TestClient(app) as c:
        ids = [c.post("/api/v1/jobs", headers=team, json={"spec": {
            "name": f"j{i}", "roles": [{"name": "w", "gpus": 1}]}}).json()["id"]
            for i in range(jobs)]
        app.state.loop.tick()
        for j in ids:
            c.post(f"/api/v1/jobs/{j}/heartbeat", headers=team)
        for k in range(reports):
            body = {"gpus": [{"index": g, "healthy": True, "utilization_gpu": float(k % 90),
                              "memory_used_bytes": 2**30 * g, "power_watts": 300.0,
                              "energy_joules": 1000.0 * k} for g in range(8)]}
            t0 = time.perf_counter()
            r = c.post("/api/v1/hosts/dgx-1/report", headers=admin, json=body)
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
    svc.engine.dispose()
    return out


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "bench/results/report.json"))
    args = ap.parse_args()
    rows = []
    dbs = Databases()
    try:
        for db in dbs.kinds():
            for label, jobs, idle in (("no job on the host", 0, False),
                                      ("8 jobs: accounting", 8, False),
                                      ("8 jobs: accounting + idle policy", 8, True)):
                # the first reports warm the caches
                times = measure(dbs.fresh(db), args.reports, jobs, idle)[20:]
                rows.append({"database": db, "case": label,
                             "median_ms": round(statistics.median(times) * 1000, 2),
                             "p95_ms": round(sorted(times)[int(len(times) * .95)] * 1000, 2)})
                print(f"{db:10} {label:34} median {rows[-1]['median_ms']:6.2f} ms  "
                      f"p95 {rows[-1]['p95_ms']:6.2f} ms")
    finally:
        dbs.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"reports": args.reports, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
