"""Heartbeats a server answers per second: one `airflow-gpu server` on PostgreSQL with
`--workers` API processes, `--hosts` DGX A100 hosts filled by `--pending` jobs (the batch
API, as service_scale.py), then `--clients` clients heartbeating the live jobs as fast as
they can, twice for `--seconds` (the first round confirms most starts: the slower
path; the second only extends leases).

    .venv/bin/python bench/heartbeat_rate.py [--hosts 1024] [--pending 9000]
        [--workers 1] [--clients 32] [--seconds 15]
        [--out bench/results/heartbeat_rate.json]

A launcher beats every third of its lease (60 s by default), so a cluster whose jobs hold
one GPU each needs GPUs / 20 heartbeats a second: 410 for 8,192 GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import Server, fresh_store  # noqa: E402
from service_scale import cluster_file, fill, settle, team_tokens  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "heartbeat_rate.json"


def beat_round(url: str, token: str, ids: list[str], clients: int, seconds: float) -> dict:
    done, failed = [0], [0]
    stop = time.monotonic() + seconds

    def run(k: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as c:
            i = k
            while time.monotonic() < stop:
                try:
                    ok = c.post(f"/api/v1/jobs/{ids[i % len(ids)]}/heartbeat",
                                json={}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                done[0] += ok
                failed[0] += not ok
                i += clients

    t0 = time.monotonic()
    workers = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.monotonic() - t0
    return {"beats_per_s": round(done[0] / wall, 1), "failed": failed[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--pending", type=int, default=9000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--pg", default=os.environ.get(
        "AIRFLOW_GPU_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="heartbeat-rate-"))
    with fresh_store("postgresql", args.pg, tmp) as db:
        tokens, admin = team_tokens(db, 2)
        server = Server(db, cluster_file(tmp / "cluster.yaml", args.hosts), args.workers,
                        tmp / "server.log")
        try:
            fill(server.url, tokens, args.pending, random.Random(1))
            settle(server.url)
            with httpx.Client(base_url=server.url, timeout=120,
                              headers={"Authorization": f"Bearer {admin}"}) as c:
                ids = [j["id"] for st in ("admitted", "running") for j in c.get(
                    "/api/v1/jobs", params={"state": st, "limit": 10_000}).json()]
            rounds = [beat_round(server.url, admin, ids, args.clients, args.seconds)
                      for _ in range(2)]
        finally:
            server.stop()
    res = {"hosts": args.hosts, "pending": args.pending, "workers": args.workers,
           "clients": args.clients, "live_jobs": len(ids), "first_round": rounds[0],
           "lease_only_round": rounds[1]}
    print(f"{args.workers} worker(s), {len(ids)} live jobs, {args.clients} clients: "
          f"{rounds[0]['beats_per_s']} beats/s (most confirming a start), then "
          f"{rounds[1]['beats_per_s']} beats/s (leases only)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "heartbeat rate", "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "result": res}, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
