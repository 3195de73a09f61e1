"""The cost of finding wrong hold rows (scheduler_core/store/integrity.py), which every
scheduling pass, cluster view, /readyz and /metrics scrape does: a cluster of 128 DGX
A100 hosts, every GPU held by a live 8-GPU job with 128 cores (1,024 GPU holds, 16,384
core holds), on SQLite and, where it answers, PostgreSQL (127.0.0.1:5432, database test).

    .venv/bin/python bench/integrity.py [--runs 9] [--out bench/results/integrity.json]

Times `integrity.find` alone, then a whole scheduling pass, /readyz and /metrics through
the real app (each once to warm up, then `--runs` times; median and slowest). The
results go to `bench/results/integrity.json` (git-ignored), a short table is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert  # noqa: E402

from airflow_gpu.scheduler_core.store import integrity  # noqa: E402
from airflow_gpu.scheduler_core.store.models import (  # noqa: E402
    AllocationRow,
    CpuHoldRow,
    GpuHoldRow,
    JobRow,
)
from report_cost import Databases  # noqa: E402
from tests.databases import serve  # noqa: E402

HOSTS = ({"name": "dgx-[1-128]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
CPUS = 128


def populate(svc) -> None:
    """A live 8-GPU, 128-core job on every host, its allocation and holds."""
    now = datetime.now(UTC)
    jobs, allocs, gpus, cpus = [], [], [], []
    for h in svc.cluster.hosts:
        job = str(uuid.uuid4())
        t = h.type
        mine = [c for c in range(t.total_cpus * 2) if any(m >> c & 1 for m in t.numa_cpus)]
        mine = mine[:CPUS]
        jobs.append({"id": job, "name": f"full-{h.name}", "team": "vision",
                     "spec": {"name": f"full-{h.name}", "team": "vision",
                              "expected_runtime": "1d",
                              "roles": [{"name": "w", "gpus": t.n_gpus, "cpus": CPUS}]},
                     "state": "running", "priority": 0, "details": {},
                     "submitted_at": now, "admitted_at": now, "started_at": now,
                     "attempt": 1})
        allocs.append({"job_id": job, "role": "w", "replica": 0, "host": h.name,
                       "gpus": list(range(t.n_gpus)), "cpus": mine, "memory_by_numa": {},
                       "nics": [], "mig": None, "live": True, "granted_at": now})
        gpus += [{"host": h.name, "gpu": g, "job_id": job} for g in range(t.n_gpus)]
        cpus += [{"host": h.name, "cpu": c, "job_id": job} for c in mine]
    with svc.sessions.begin() as s:
        for model, rows in ((JobRow, jobs), (AllocationRow, allocs), (GpuHoldRow, gpus),
                            (CpuHoldRow, cpus)):
            s.execute(insert(model), rows)


def timed(fn, runs: int) -> dict:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_ms": round(statistics.median(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1), "runs": runs}


def measure(db_url: str, runs: int) -> dict:
    out = {}
    for api in serve(db_url, hosts=HOSTS):
        svc = api.service
        populate(svc)

        def find(svc=svc):
            with svc.reads() as s:
                assert integrity.find(s, svc.cluster) == []

        out["find"] = timed(find, runs)
        out["pass"] = timed(api.tick, runs)
        out["readyz"] = timed(lambda api=api: api.get("/readyz").raise_for_status(), runs)
        out["metrics"] = timed(lambda api=api: api.get("/metrics").raise_for_status(), runs)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "integrity.json"))
    args = p.parse_args()
    dbs = Databases()
    results = {}
    try:
        for kind in dbs.kinds():
            results[kind] = measure(dbs.fresh(kind), args.runs)
    finally:
        dbs.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.platform(), "hosts": 128, "gpu_holds": 1024,
        "cpu_holds": 128 * CPUS, "results": results}, indent=2) + "\n")
    for kind, r in results.items():
        for what, t in r.items():
            print(f"{kind:10} {what:8} median {t['median_ms']:8.1f} ms  "
                  f"max {t['max_ms']:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
