"""How soon deferred Airflow tasks hear of their admission, and what they cost the service:
`--tasks` AdmissionTriggers in one event loop (one triggerer) against a real `airflow-gpu
server` (SQLite, 8 dgx-a100 hosts: 64 GPUs, one-GPU jobs, a pass every 2 s and at once
after each finish); each admitted job is finished at once, freeing its GPU for the next.
The scenario of tests/e2e/test_many_deferred.py.

    .venv/bin/python bench/deferred_wait.py [--tasks 500] [--out bench/results/deferred.json]

Reports the seconds from each admission (the service's admitted_at) to its trigger's
event (median, p95, max), the watcher's requests per second, and the bound; to
bench/results/deferred.json (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_gpu.triggers import watch  # noqa: E402
from tests.e2e.test_many_deferred import CLUSTER, waves  # noqa: E402
from tests.servers import Server, prepared  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "deferred.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="deferred-"))
    db = f"sqlite:///{tmp / 'deferred.db'}"
    _, token, cluster = prepared(db, tmp, CLUSTER, "vision")
    server = Server(db, cluster, lease_ttl=600, interval=2.0, log=tmp / "server.log")
    host, port = server.url.removeprefix("http://").split(":")
    os.environ["AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT"] = json.dumps(
        {"conn_type": "gpu_scheduler", "host": host, "port": int(port), "password": token})
    try:
        got = waves(server.url, token, args.tasks)
    finally:
        server.stop()
    lat = got.pop("resume_s")
    result = {
        "benchmark": "deferred tasks told of admission",
        "when": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
        **got, "resume_median_s": round(statistics.median(lat), 3),
        "resume_p95_s": round(lat[int(0.95 * (len(lat) - 1))], 3),
        "resume_max_s": round(lat[-1], 3),
        "requests_per_s": round(got["requests"] / got["wall_s"], 2),
        "bound_requests_per_s": 1 / watch.GAP, "target_resume_s": 1.0}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{args.tasks} deferred tasks in one triggerer: admission -> task told: median "
          f"{result['resume_median_s']} s, p95 {result['resume_p95_s']} s, max "
          f"{result['resume_max_s']} s; the watcher sent {got['requests']} requests in "
          f"{got['wall_s']:.1f} s ({result['requests_per_s']}/s; bound "
          f"{result['bound_requests_per_s']:g}/s); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
