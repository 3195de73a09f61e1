"""Three replicas with their default settings on a PostgreSQL with its default
max_connections (100, 3 reserved for superusers) under many clients: how many requests
fail, how many connections the replicas hold at peak, and whether a role that is not a
superuser can still connect meanwhile (issue: 4.4 % of requests got 503 with a pool of 41
per replica, and followers could not run their leader election).

    .venv/bin/python bench/connection_budget.py [--clients 150] [--seconds 20]
        [--out bench/results/connection_budget.json]

Starts a PostgreSQL of its own (initdb; needs root and PostgreSQL's binaries) and three
`airflow-gpu server` processes with no pool size set; `--clients` threads submit and list
jobs round-robin across them. The results go to `--out` (git-ignored); a summary is
printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psycopg  # noqa: E402
import yaml  # noqa: E402

from airflow_gpu.scheduler_core.service.auth import create_token  # noqa: E402
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade  # noqa: E402
from tests.databases import HOSTS  # noqa: E402
from tests.scheduler_core.store.test_hardening_store import Load, Postgres  # noqa: E402
from tests.servers import Server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=150)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench/results/connection_budget.json"))
    args = ap.parse_args()
    work = Path(f"/tmp/airflow-gpu-bench-budget-{int(time.time())}")
    work.mkdir(parents=True)
    cluster = work / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "c", "hosts": list(HOSTS)}))
    pg = Postgres(max_connections=100)
    servers: list[Server] = []
    try:
        engine = make_engine(pg.url)
        upgrade(engine)
        token = create_token(sessions(engine), "vision")
        engine.dispose()
        for i in range(3):
            servers.append(Server(pg.url, cluster, log=work / f"s{i}.log",
                                  args=("--log-level", "info")))
        load = Load([s.url for s in servers], token, clients=args.clients)
        peak, other = 0, collections.Counter()
        end = time.monotonic() + args.seconds
        try:
            while time.monotonic() < end:
                peak = max(peak, pg.gpu_connections())
                try:
                    with psycopg.connect(host="127.0.0.1", port=pg.port, user="gpu",
                                         dbname="gpu", connect_timeout=5) as conn:
                        conn.execute("SELECT 1")
                    other["connected"] += 1
                except psycopg.OperationalError as exc:
                    other[str(exc).strip().splitlines()[-1][:120]] += 1
                time.sleep(0.5)
        finally:
            load.close()
        healths = [httpx.get(f"{s.url}/healthz", timeout=30).json() for s in servers]
        budget = [line.split(": ", 1)[1] for s in range(3)
                  for line in (work / f"s{s}.log").read_text().splitlines()
                  if "connection budget:" in line]
    finally:
        for s in servers:
            s.stop()
        pg.close()
        shutil.rmtree(work, ignore_errors=True)
    results = list(load.results)
    codes = collections.Counter(str(r[1]) for r in results)
    failed = sum(n for c, n in codes.items() if c not in ("200", "201"))
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "clients": args.clients, "seconds": args.seconds, "max_connections": 100,
        "requests": len(results), "status": dict(codes),
        "failed_percent": round(100 * failed / max(1, len(results)), 2),
        "peak_connections": peak, "other_client": dict(other),
        "leaders": sum(bool(h.get("scheduling")) for h in healths),
        "followers_see_leader": sum(bool(h.get("leader")) and not h.get("scheduling")
                                    for h in healths),
        "budget_lines": budget[:1],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
