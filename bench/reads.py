"""The cost of the service's heavy reads: the accounting report over ten years with
5,000 grants (per day and team, per team, per job), and /metrics with 5,000 pending and
5,000 finished jobs. Through the real app and store (the data bulk-inserted as
tests/scheduler_core/service/test_accounting_scale.py inserts it), on SQLite and, where it answers,
PostgreSQL (127.0.0.1:5432, database test), on a cluster of 16 DGX A100 hosts.

    .venv/bin/python bench/reads.py [--runs 5] [--out bench/results/reads.json]

Each read runs once to warm up, then `--runs` times (/metrics: 4 x `--runs`); the
median and the slowest go to `bench/results/reads.json` (git-ignored), and a short table
is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report_cost import Databases  # noqa: E402
from tests.databases import serve  # noqa: E402
from tests.scheduler_core.api.test_api import auth  # noqa: E402
from tests.scheduler_core.service import test_accounting_scale as scale  # noqa: E402

HOSTS = ({"name": "dgx-[1-16]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


def timed(fn, runs: int) -> dict:
    fn()                                   # warm-up (and the answer's check)
    times, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    # the CPU time of this process (the app runs in it; not PostgreSQL's): on a loaded
    # machine the wall time also counts the time others had the cores
    return {"median_ms": round(statistics.median(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1),
            "median_cpu_ms": round(statistics.median(cpu) * 1000, 1), "runs": runs}


def accounting(db_url: str, runs: int) -> dict:
    out = {}
    for api in serve(db_url, hosts=HOSTS):
        scale.populate(api.service)
        for by in ("day", "team", "job"):
            def read(by=by, api=api):
                r = api.get("/api/v1/accounting", headers=auth(api, "nlp"),
                            params={"by": by, "since": scale.SINCE.isoformat(),
                                    "until": scale.UNTIL.isoformat()})
                assert r.status_code == 200, r.text
                return r
            out[f"accounting_by_{by}"] = {**timed(read, runs),
                                          "rows": len(read().json()["rows"])}
    return out


def metrics(db_url: str, runs: int) -> dict:
    for api in serve(db_url, hosts=HOSTS):
        scale.populate(api.service, grants=0, pending=5000, finished=5000)

        def read(api=api):
            r = api.get("/metrics")
            assert r.status_code == 200, r.text
        return {"metrics": timed(read, runs * 4)}
    return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/reads.json")
    args = ap.parse_args()
    results = {}
    dbs = Databases()
    try:
        for db in dbs.kinds():
            results[db] = {**accounting(dbs.fresh(db), args.runs),
                           **metrics(dbs.fresh(db), args.runs)}
            for name, r in results[db].items():
                print(f"{db:10} {name:20} median {r['median_ms']:8.1f} ms  "
                      f"max {r['max_ms']:8.1f} ms  cpu {r['median_cpu_ms']:8.1f} ms")
    finally:
        dbs.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "machine": platform.machine(),
        "load_average": list(os.getloadavg()),
        "grants": 5000, "window_days": round((scale.UNTIL - scale.SINCE).days, 1),
        "metrics_jobs": {"pending": 5000, "finished": 5000}, "hosts": 16,
        "results": results}, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
