"""How soon a silent launcher's job is lost while passes are slow: a real `airflow-gpu
server` (--interval 0.1, --lease-ttl 9 by default) whose 16 GPUs one admitted job holds
(its launcher never heartbeats), with 5,000 pending jobs of one team bulk-inserted (as
tests/scheduler_core/service/test_lease_schedule.py does), on SQLite and, where it
answers, PostgreSQL
(127.0.0.1:5432, database test).

    .venv/bin/python bench/lease_expiry.py [--ttl 9] [--pending 5000] [--wait 300] \
        [--out bench/results/lease_expiry.json]

For each database: seconds from the job's admission (its lease's start) to `lost`, the
lease, how much later than the lease that was, the passes completed meanwhile and their
mean duration (the server's /metrics); to bench/results/lease_expiry.json (git-ignored)
and a short table.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.databases import _drop_pg_schema, _pg_schema_url  # noqa: E402
from tests.scheduler_core.service import test_lease_schedule as scenario  # noqa: E402
from tests.servers import Server  # noqa: E402


def pass_stats(server: Server) -> tuple[int, float]:
    body = httpx.get(f"{server.url}/metrics", timeout=30).text
    got = {k: float(v) for k, v in re.findall(
        r"^airflow_gpu_scheduling_pass_seconds_(count|sum) (\S+)$", body, re.M)}
    return int(got.get("count", 0)), got.get("sum", 0.0)


def run(db_url: str, ttl: float, pending: int, wait: float = 300) -> dict:
    from airflow_gpu.scheduler_core.service.auth import create_token
    from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade

    tmp = Path(tempfile.mkdtemp(prefix="lease-bench-"))
    engine = make_engine(db_url)
    upgrade(engine)
    headers = {"Authorization": f"Bearer {create_token(sessions(engine), 'vision')}"}
    cluster = tmp / "cluster.yaml"
    import yaml

    cluster.write_text(yaml.safe_dump({"cluster": "bench", "hosts": list(scenario.HOSTS)}))
    server = Server(db_url, cluster, lease_ttl=ttl, interval=0.1, log=tmp / "server.log")
    try:
        job = scenario.submit(server, headers, scenario.spec("silent", 8, replicas=2))
        while (row := scenario.job_row(engine, job)).state != "admitted":
            time.sleep(0.05)
        admitted = scenario.aware(row.admitted_at)
        scenario.bulk_pending(engine, pending)
        before = pass_stats(server)
        deadline = time.monotonic() + ttl + wait
        while (row := scenario.job_row(engine, job)).state == "admitted":
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        after = pass_stats(server)
        lost_at = scenario.aware(row.finished_at) if row.state == "lost" else None
        n = after[0] - before[0]
        took = (lost_at - admitted).total_seconds() if lost_at else None
        return {"state": row.state, "lease_ttl_s": ttl, "pending": pending,
                "lost_after_s": round(took, 2) if took is not None else None,
                "over_lease_s": round(took - ttl, 2) if took is not None else None,
                "passes_meanwhile": n,
                "mean_pass_s": round((after[1] - before[1]) / n, 3) if n else None,
                "extended": "leases are extended" in (tmp / "server.log").read_text()}
    finally:
        server.stop()
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttl", type=float, default=9.0)
    ap.add_argument("--pending", type=int, default=5000)
    ap.add_argument("--wait", type=float, default=300,
                    help="seconds past the lease to wait for `lost` before giving up")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lease_expiry.json"))
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        results["sqlite"] = run(f"sqlite:///{d}/bench.db", args.ttl, args.pending, args.wait)
    try:
        schema, url = _pg_schema_url()
    except Exception as exc:  # noqa: BLE001 - no PostgreSQL here: SQLite only
        print(f"PostgreSQL skipped: {exc}")
    else:
        try:
            results["postgresql"] = run(url, args.ttl, args.pending, args.wait)
        finally:
            _drop_pg_schema(schema)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"at": datetime.now(UTC).isoformat(timespec="seconds"),
                               "machine": platform.platform(), "results": results},
                              indent=2) + "\n")
    print(f"{'database':12} {'state':6} {'lost after':>10} {'over lease':>10} "
          f"{'passes':>6} {'mean pass':>9} extended")
    for db, r in results.items():
        print(f"{db:12} {r['state']:6} {r['lost_after_s']!s:>10} {r['over_lease_s']!s:>10} "
              f"{r['passes_meanwhile']:>6} {r['mean_pass_s']!s:>9} {r['extended']}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
