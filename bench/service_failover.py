"""The leader killed at scale: two `airflow-gpu server` replicas on one PostgreSQL store
with a long queue; the leader is SIGKILLed while it runs its passes, and the bench
measures how long the other takes to lead, rebuild its state and admit again.

    .venv/bin/python bench/service_failover.py [--hosts 1024] [--pending 50000]
        [--teams 10] [--out bench/results/service_failover.json]

Replica A fills a fresh store (the batch API, as service_scale.py) until the cluster is
full, with launcher stand-ins heartbeating every admitted job. Replica B starts as a
follower. A is killed (SIGKILL) at a random moment of its back-to-back passes; the
launchers turn to B, a priority-100 job of 1 GPU is submitted to B and one running 1-GPU
job finished. Measured: seconds from the kill until B says it leads, until B completes a
pass, and until the probe is admitted. Then the database is checked: no GPU held twice
by live allocations, every job submitted still there, none lost for want of a lease.
Results go to `--out` (JSON); docs/service.md ("Scale") quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import Server, fresh_store  # noqa: E402
from service_scale import (  # noqa: E402
    Launchers,
    cluster_file,
    fill,
    finish,
    job_spec,
    running_1gpu,
    settle,
    team_tokens,
)

OUT = Path(__file__).resolve().parent / "results" / "service_failover.json"


def until(what, since: float, most: float = 120.0, every: float = 0.05) -> float | None:
    """Seconds from `since` (a monotonic time) until `what()` is true (None: not within
    `most` seconds of now)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < most:
        try:
            if what():
                return round(time.monotonic() - since, 2)
        except httpx.HTTPError:
            pass
        time.sleep(every)
    return None


def checked(db: str, submitted: int) -> dict:
    """What the store says after the failover: GPUs held twice, jobs gone or lost."""
    engine = create_engine(db)
    with engine.connect() as conn:
        held = Counter()
        for host, gpus in conn.execute(text(
                "SELECT host, gpus FROM allocations WHERE live")):
            for g in (gpus if isinstance(gpus, list) else json.loads(gpus)):
                held[(host, g)] += 1
        states = dict(conn.execute(text("SELECT state, count(*) FROM jobs GROUP BY state"))
                      .all())
    engine.dispose()
    return {"gpus_held_twice": sum(1 for n in held.values() if n > 1),
            "jobs": sum(states.values()), "jobs_submitted": submitted,
            "jobs_lost": states.get("lost", 0), "states": states}


def run(args, tmp: Path) -> dict:
    rng = random.Random(1)
    with fresh_store("postgresql", args.pg, tmp) as db:
        tokens, admin = team_tokens(db, args.teams)
        cluster = cluster_file(tmp / f"cluster-{args.hosts}.yaml", args.hosts)
        a = Server(db, cluster, 1, tmp / "replica-a.log")
        b = None
        beats = Launchers(a.url, admin, db, batch=500)
        try:
            fill(a.url, tokens, args.pending, rng)
            beats.start()
            filled = settle(a.url)
            b = Server(db, cluster, 1, tmp / "replica-b.log")
            with httpx.Client(base_url=b.url, timeout=60,
                              headers={"Authorization": f"Bearer {admin}"}) as c:
                victims = running_1gpu(c)
            time.sleep(rng.uniform(2.0, 4.0))          # inside A's back-to-back passes
            a.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            beats.stop.set()
            beats.join(timeout=60)
            beats = Launchers(b.url, admin, db, batch=500)
            beats.start()
            with httpx.Client(base_url=b.url, timeout=60) as c, httpx.Client(
                    base_url=b.url, timeout=60,
                    headers={"Authorization": f"Bearer {tokens[0]}"}) as t, httpx.Client(
                    base_url=b.url, timeout=60,
                    headers={"Authorization": f"Bearer {admin}"}) as ad:
                probe = t.post("/api/v1/jobs", json={"spec": {
                    **job_spec("failover-probe", 1), "priority": 100}}).json()
                finish(ad, victims[0])
                leads = until(lambda: c.get("/healthz").json().get("scheduling"), killed)
                passed = until(lambda: c.get("/healthz").json().get("passes", 0) > 0, killed)
                admitted = until(lambda: t.get(f"/api/v1/jobs/{probe['id']}").json()
                                 ["state"] != "pending", killed)
        finally:
            beats.stop.set()
            beats.join(timeout=60)
            a.stop()
            if b is not None:
                b.stop()
        out = checked(db, args.pending + 1)
    res = {"hosts": args.hosts, "pending": args.pending, "fill_up_s": round(filled, 1),
           "kill_to_leading_s": leads, "kill_to_first_pass_s": passed,
           "kill_to_admitted_s": admitted, **out}
    print(f"{args.hosts} hosts, {args.pending} pending: leader killed; the other led after "
          f"{res['kill_to_leading_s']} s, passed after {res['kill_to_first_pass_s']} s, "
          f"admitted the probe after {res['kill_to_admitted_s']} s; GPUs held twice "
          f"{out['gpus_held_twice']}, jobs {out['jobs']} of {out['jobs_submitted']}, "
          f"lost {out['jobs_lost']}", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--pending", type=int, default=50_000)
    ap.add_argument("--teams", type=int, default=10)
    ap.add_argument("--pg", default=os.environ.get(
        "AIRFLOW_GPU_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    res = run(args, Path(tempfile.mkdtemp(prefix="service-failover-")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "service failover", "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "result": res}, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
