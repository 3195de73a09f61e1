"""The service at scale: one `airflow-gpu server` (default settings, one process) with a
long queue, measured over loopback as a large site would use it.

    .venv/bin/python bench/service_scale.py [--db postgresql,sqlite] [--hosts 1024]
        [--pending 50000] [--teams 10] [--minutes 5] [--out bench/results/service_scale.json]

For each database: a fresh store and server on `--hosts` DGX A100 hosts (32 per switch,
4 switches per rack); `--pending` jobs of a Philly-like size mix (1, 2, 4, 8 and 16
GPUs; 1 h) submitted through the batch API by `--teams` teams, more than the cluster
holds, so the queue stays long. Launcher stand-ins heartbeat every admitted job every
20 s (a third of the lease, as the operators do), so no job is lost: `--beat-batch` jobs
a request (`POST /api/v1/jobs/heartbeats`, as a launcher of many jobs beats), or with 0
one request per job (as each Airflow operator beats its own); for `--minutes`, one
running job finishes every second (the cluster stays full), while the bench measures:

- the fill-up: the passes that admit until the cluster is full (at most
  max_jobs_tested jobs each), their count and longest; the steady phase starts then;
- pass time: every pass the server completes (`/healthz`'s `passes` and
  `last_pass_seconds`, sampled every 0.1 s), p50 and p95; passes that failed
  (`airflow_gpu_pass_errors_total{kind="pass"}`);
- free -> admitted: every 10 s a priority-100 job of 1 GPU waits, a running 1-GPU job is
  finished, and the time until the probe reads `admitted` is taken (the median);
- submits/s while passes run: 8 threads post single jobs for 10 s (each its own
  idempotency key), a third of the way in, and batches of 100 jobs (the batch API, as
  an array or a DAG of many tasks submits) two thirds in; then they are cancelled
  (bulk) so the queue keeps its size;
- the queue views while passes run, five sixths of the way in: `queue --limit 100`,
  one team's `prio` and `share` (seconds, the median of three);
- RSS of the server process every 5 s (first, last, max).

Results go to `--out` (JSON); docs/service.md ("Scale") quotes them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import Server, cli, fresh_store  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "service_scale.json"
SIZES = ((1, 0.70), (2, 0.10), (4, 0.10), (8, 0.07), (16, 0.03))   # GPUs, share


def cluster_file(path: Path, hosts: int) -> Path:
    lines = ["cluster: scale", "hosts:"]
    for first in range(1, hosts + 1, 32):
        last = min(first + 31, hosts)
        sw = (first - 1) // 32
        lines.append(f"  - {{name: 'dgx-[{first:05d}-{last:05d}]', model: dgx-a100, "
                     f"rack: r{sw // 4}, switch: s{sw}}}")
    path.write_text("\n".join(lines) + "\n")
    return path


def job_spec(name: str, gpus: int) -> dict:
    roles = ([{"name": "w", "gpus": gpus}] if gpus <= 8 else
             [{"name": "w", "replicas": gpus // 8, "gpus": 8}])
    return {"name": name, "expected_runtime": "1h", "roles": roles}


def fill(url: str, tokens: list[str], pending: int, rng: random.Random) -> float:
    """Submit `pending` jobs in batches of 1,000, round robin over the teams; returns the
    submits per second."""
    t0 = time.perf_counter()
    clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {t}"},
                            timeout=120) for t in tokens]
    done = 0
    while done < pending:
        n = min(1000, pending - done)
        jobs = []
        for i in range(n):
            gpus = rng.choices([g for g, _ in SIZES], [p for _, p in SIZES])[0]
            jobs.append({"spec": job_spec(f"q-{done + i}", gpus)})
        r = clients[(done // 1000) % len(clients)].post("/api/v1/jobs/batch",
                                                        json={"jobs": jobs})
        if r.status_code != 201:
            raise SystemExit(f"batch submit: {r.status_code} {r.text[:300]}")
        done += n
    for c in clients:
        c.close()
    return pending / (time.perf_counter() - t0)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Watch(threading.Thread):
    """Samples /healthz (passes) and the server's RSS until stopped."""

    def __init__(self, url: str, pid: int):
        super().__init__(daemon=True)
        self.url, self.pid = url, pid
        self.passes: list[float] = []
        self.at: list[float] = []          # when each pass was seen, seconds from t0
        self.phases: list[dict] = []       # and its parts (/healthz's last_pass_phases)
        self.rss: list[tuple[float, float]] = []
        self.marks: list[tuple[float, str]] = []      # what the bench did when
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def reset(self) -> list[float]:
        """Start the passes anew; returns those seen so far."""
        with self.lock:
            seen, self.passes, self.at, self.phases = self.passes, [], [], []
        return seen

    def mark(self, what: str) -> None:
        self.marks.append((round(time.monotonic() - self.t0, 1), what))

    def slowest(self, n: int = 8) -> list[tuple[float, float, dict]]:
        """The `n` longest passes: (when, seconds, its parts)."""
        return sorted(zip(self.at, self.passes, self.phases, strict=True),
                      key=lambda p: -p[1])[:n]

    def run(self) -> None:
        seen, t0, last_rss = None, self.t0, -10.0
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.stop.is_set():
                try:
                    h = c.get("/healthz").json()
                except httpx.HTTPError:
                    h = {}
                n = h.get("passes")
                if n is not None and seen is not None and n > seen:
                    with self.lock:
                        self.passes.append(h["last_pass_seconds"])
                        self.at.append(round(time.monotonic() - t0, 1))
                        self.phases.append(h.get("last_pass_phases") or {})
                seen = n if n is not None else seen
                now = time.monotonic()
                if now - last_rss >= 5:
                    self.rss.append((round(now - t0, 1), round(rss_mb(self.pid), 1)))
                    last_rss = now
                self.stop.wait(0.1)


class Launchers(threading.Thread):
    """The launchers' heartbeats: every admitted or running job is heartbeated every
    `every` seconds (a launcher beats every third of its 60 s lease), so that no job is
    lost for want of a launcher. `batch` 0: one request per job, as each Airflow
    operator beats its own (`threads` connections, spread evenly over the round); else
    `POST /api/v1/jobs/heartbeats` with `batch` jobs a request, as a launcher running
    many jobs does. The jobs to beat are read from the database each round, as each
    launcher knows the jobs it started (a listing through the API would be load no
    launcher adds)."""

    def __init__(self, url: str, token: str, db: str, every: float = 20.0,
                 threads: int = 16, batch: int = 0):
        super().__init__(daemon=True)
        self.url, self.token, self.every, self.threads = url, token, every, threads
        self.engine = create_engine(db, pool_size=1)
        self.batch = batch
        self.stop = threading.Event()
        self.beats = 0
        self.failed = 0
        self.slow: list[float] = []

    def live(self) -> list[tuple[str, int]]:
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT id, attempt FROM jobs WHERE state IN ('admitted', 'running', "
                "'preempting')"))]

    def run(self) -> None:
        clients = [httpx.Client(base_url=self.url, timeout=60,
                                headers={"Authorization": f"Bearer {self.token}"})
                   for _ in range(self.threads)]
        while not self.stop.is_set():
            t0 = time.monotonic()
            jobs = self.live()
            if self.batch:
                jobs = [jobs[k:k + self.batch] for k in range(0, len(jobs), self.batch)]
            spread = self.every / max(1, len(jobs))
            workers = [threading.Thread(target=self._beat, args=(
                clients[k], jobs[k::self.threads], t0 + k * spread, spread * self.threads))
                for k in range(self.threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            self.stop.wait(max(0.0, t0 + self.every - time.monotonic()))
        for c in clients:
            c.close()
        self.engine.dispose()

    def _beat(self, client: httpx.Client, items: list, start: float, gap: float) -> None:
        for n, item in enumerate(items):         # evenly spread over the round
            if self.stop.wait(max(0.0, start + n * gap - time.monotonic())):
                return
            b0 = time.perf_counter()
            try:
                if self.batch:
                    client.post("/api/v1/jobs/heartbeats", json={"jobs": [
                        {"id": i, "attempt": a} for i, a in item]}).raise_for_status()
                else:
                    client.post(f"/api/v1/jobs/{item[0]}/heartbeat",
                                params={"attempt": item[1]})
            except httpx.HTTPError:        # no answer in 60 s: counted, the jobs beaten
                self.failed += len(item) if self.batch else 1   # next round (60 s lease)
                continue
            self.slow.append(time.perf_counter() - b0)
            self.beats += len(item) if self.batch else 1


def running_1gpu(c: httpx.Client) -> list[str]:
    """Running jobs of one GPU: finishing one frees exactly what a 1-GPU probe needs."""
    # admitted (not yet confirmed) and running: on a full cluster where nothing is
    # admitted any more, the running ones are the only ones to finish
    jobs = [j for state in ("admitted", "running")
            for j in c.get("/api/v1/jobs", params={"state": state, "limit": 2000}).json()]
    return [j["id"] for j in jobs
            if j["spec"]["roles"] == [{"name": "w", "gpus": 1}] or
            [(r.get("replicas", 1), r.get("gpus")) for r in j["spec"]["roles"]] == [(1, 1)]]


def again(call, *args, **kw):
    """A request, sent again once where the server closed an idle kept-alive connection
    as it was reused (a race of HTTP keep-alive, not an answer)."""
    try:
        return call(*args, **kw)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return call(*args, **kw)


def finish(c: httpx.Client, job_id: str) -> None:
    again(c.post, f"/api/v1/jobs/{job_id}/heartbeat", json={})
    again(c.post, f"/api/v1/jobs/{job_id}/finish", json={"outcome": "succeeded"})


def steady(url: str, admin: str, team: str, minutes: float, watch: Watch) -> dict:
    """The steady phase: one finish a second, a probe every 10 s, two submit bursts."""
    lat, submit, slow, why = [], {}, [], None
    end = time.monotonic() + minutes * 60
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"},
                      timeout=120) as c, httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {team}"}, timeout=120) as t:
        # one burst of single submits a third of the way, one of batches at two thirds
        bursts = [(time.monotonic() + minutes * 20, 1), (time.monotonic() + minutes * 40, 100)]
        nxt_probe = time.monotonic() + 5
        views_at: float | None = time.monotonic() + minutes * 50     # at five sixths
        victims: list[str] = []
        while time.monotonic() < end:
            if not victims:
                victims = again(running_1gpu, c)
                random.shuffle(victims)
            if time.monotonic() >= nxt_probe and victims:
                probe = again(t.post, "/api/v1/jobs", json={"spec": {
                    **job_spec(f"probe-{uuid.uuid4().hex[:6]}", 1), "priority": 100}}).json()
                time.sleep(2.5)                # a pass or more sees it waiting
                finish(c, victims.pop())
                t0 = time.perf_counter()
                while (seen := again(t.get, f"/api/v1/jobs/{probe['id']}").json())[
                        "state"] == "pending":
                    if time.perf_counter() - t0 > 60:
                        break
                    time.sleep(0.005)
                    why = (seen.get("pending") or {}).get("reason")
                lat.append(time.perf_counter() - t0)
                if lat[-1] > 1.0:            # slow: what the probe was told meanwhile
                    slow.append({"s": round(lat[-1], 2), "reason": why})
                nxt_probe = time.monotonic() + 10
            elif bursts and time.monotonic() >= bursts[0][0]:
                size = bursts.pop(0)[1]
                watch.mark(f"submits of {size} a request")
                submit.update(submit_burst(url, team, size))
                watch.mark("cancelled")
            elif views_at is not None and time.monotonic() >= views_at:
                views_at = None
                watch.mark("views")
                submit.update(view_times(c))
            elif victims:
                finish(c, victims.pop())
                time.sleep(1.0)
            else:
                time.sleep(1.0)
    return {"admission_median_s": round(statistics.median(lat), 4) if lat else None,
            "admission_p95_s": round(sorted(lat)[int(0.95 * (len(lat) - 1))], 4)
            if lat else None, "admission_rounds": len(lat), "admission_slow": slow[:10],
            **submit}


VIEWS = {"queue_100": "/api/v1/queue?limit=100", "prio_team": "/api/v1/priorities?team=team0",
         "share": "/api/v1/shares"}


def view_times(c: httpx.Client, rounds: int = 3) -> dict:
    """Seconds a user waits for `queue --limit 100`, one team's `prio` and `share` (the
    median of `rounds`) while passes run."""
    out = {}
    for key, path in VIEWS.items():
        took = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            again(c.get, path).raise_for_status()
            took.append(time.perf_counter() - t0)
        out[f"view_{key}_s"] = round(statistics.median(took), 3)
    return out


def submit_burst(url: str, token: str, batch: int = 1, seconds: float = 10.0,
                 threads: int = 8) -> dict:
    """`threads` clients submit for `seconds`: one job a request (`batch` 1), or `batch`
    jobs a request through the batch API; then the jobs are cancelled (bulk) so the
    queue keeps its size."""
    made = [0]
    errors = [0]
    stop = time.monotonic() + seconds

    def run(k: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as c:
            i = 0
            while time.monotonic() < stop:
                jobs = [{"spec": job_spec("burst", 1),
                         "idempotency_key": f"burst-{batch}-{k}-{i}-{n}"} for n in range(batch)]
                r = (c.post("/api/v1/jobs", json=jobs[0]) if batch == 1 else
                     c.post("/api/v1/jobs/batch", json={"jobs": jobs}))
                if r.status_code == 201:
                    made[0] += batch
                else:
                    errors[0] += 1
                i += 1

    t0 = time.perf_counter()
    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                      timeout=120) as c:
        c.post("/api/v1/jobs/cancel", json={"name": "burst"})
    key = "submits_per_s" if batch == 1 else f"submits_per_s_batch_{batch}"
    return {key: round(made[0] / wall, 1), f"{key}_errors": errors[0]}


def admissions(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith("airflow_gpu_admissions_total "):
            return float(line.split()[-1])
    return 0.0


def settle(url: str, quiet: int = 3, most: float = 120.0) -> float:
    """Wait until `quiet` passes in a row admit nothing (the cluster is full: each pass
    admits at most max_jobs_tested jobs), at most `most` seconds; returns the seconds it
    took."""
    t0 = time.monotonic()

    def passes() -> int:
        return httpx.get(f"{url}/healthz", timeout=60).json().get("passes", 0)

    last, since = admissions(url), passes()
    while time.monotonic() - t0 < most:
        time.sleep(5.0)                     # a scrape every 5 s (Prometheus: 15-60 s)
        now, done = admissions(url), passes()
        if now != last:
            last, since = now, done
        elif done - since >= quiet:
            break
    return time.monotonic() - t0


def pass_errors(url: str) -> tuple[float, dict[str, float], float]:
    """The passes that failed, the times the leader rebuilt its state, by why, and the
    jobs lost for want of a heartbeat (the launcher stand-ins fell behind)."""
    failed, rebuilt, lost = 0.0, {}, 0.0
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith('airflow_gpu_pass_errors_total{kind="pass"}'):
            failed = float(line.split()[-1])
        elif line.startswith("airflow_gpu_lease_expiries_total "):
            lost = float(line.split()[-1])
        elif line.startswith("airflow_gpu_state_rebuilds_total{"):
            rebuilt[line.split('"')[1]] = float(line.split()[-1])
    return failed, rebuilt, lost


def team_tokens(db: str, teams: int) -> tuple[list[str], str]:
    """Tokens of teams team0 .. team{teams - 1}, and an admin's."""
    tokens = [cli("token", "create", "--team", f"team{i}", "--db", db) for i in range(teams)]
    return tokens, cli("token", "create", "--team", "ops", "--admin", "--db", db)


def run_one(kind: str, args, tmp: Path) -> dict:
    rng = random.Random(1)
    with fresh_store(kind, args.pg, tmp) as db:
        tokens, admin = team_tokens(db, args.teams)
        cluster = cluster_file(tmp / f"cluster-{args.hosts}.yaml", args.hosts)
        server = Server(db, cluster, 1, tmp / f"server-{kind}.log")
        watch = Watch(server.url, server.proc.pid)
        beats = Launchers(server.url, admin, db, batch=args.beat_batch)
        try:
            fill_rate = fill(server.url, tokens, args.pending, rng)
            watch.start()
            beats.start()
            # passes admit until the cluster is full (at most max_jobs_tested each)
            filled = settle(server.url, most=120.0 + args.hosts / 16)
            ramp = watch.reset()              # what follows: the steady state
            watch.mark("steady")
            out = steady(server.url, admin, tokens[0], args.minutes, watch)
            failed, rebuilt, lost = pass_errors(server.url)
        finally:
            watch.stop.set()
            beats.stop.set()
            watch.join(timeout=5)
            beats.join(timeout=30)
            server.stop()
    p = sorted(watch.passes)
    rss = [m for _, m in watch.rss]
    res = {"db": kind, "hosts": args.hosts, "pending": args.pending, "teams": args.teams,
           "beat_batch": args.beat_batch,
           "minutes": args.minutes, "fill_submits_per_s": round(fill_rate, 1),
           "passes": len(p), "pass_p50_s": round(statistics.median(p), 4) if p else None,
           "pass_p95_s": round(p[int(0.95 * (len(p) - 1))], 4) if p else None,
           "passes_failed": failed, "state_rebuilds": rebuilt, "jobs_lost": lost, **out,
           "heartbeats": beats.beats,
           "heartbeats_failed": beats.failed,
           "heartbeat_p50_s": round(statistics.median(beats.slow), 4) if beats.slow else None,
           "heartbeat_p95_s": round(sorted(beats.slow)[int(0.95 * (len(beats.slow) - 1))], 4)
           if beats.slow else None,
           "fill_up_s": round(filled, 1), "fill_up_passes": len(ramp),
           "fill_up_pass_max_s": round(max(ramp), 4) if ramp else None,
           "slowest_passes": watch.slowest(), "marks": watch.marks,
           "rss_mb": {"first": rss[0] if rss else None, "last": rss[-1] if rss else None,
                      "max": max(rss) if rss else None}, "rss_series": watch.rss}
    print(f"{kind:10s} {args.hosts} hosts, {args.pending} pending: cluster full after "
          f"{filled:.0f} s ({len(ramp)} passes, longest {res['fill_up_pass_max_s']} s); "
          "then pass p50 "
          f"{res['pass_p50_s']} s p95 {res['pass_p95_s']} s ({len(p)} passes, "
          f"{failed:g} failed, state rebuilt {rebuilt}, {lost:g} jobs lost); "
          f"free -> admitted median {res['admission_median_s']} s; "
          f"submits {res.get('submits_per_s')}/s (in batches of 100: "
          f"{res.get('submits_per_s_batch_100')}/s); heartbeat p95 {res['heartbeat_p95_s']} s; "
          f"views: queue {res.get('view_queue_100_s')} s, prio {res.get('view_prio_team_s')} "
          f"s, share {res.get('view_share_s')} s; RSS {res['rss_mb']} MB", flush=True)
    return res


@contextlib.contextmanager
def autovacuum(pg: str | None) -> Iterator[str | None]:
    """PostgreSQL's autovacuum on for the run, as on any production server (a test
    machine's may have it off: then it is turned on, and off again afterwards); yields
    what the results record."""
    if pg is None:
        yield None
        return
    engine = create_engine(pg, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        was = conn.execute(text("SHOW autovacuum")).scalar()
        if was == "off":
            conn.execute(text("ALTER SYSTEM SET autovacuum = on"))
            conn.execute(text("SELECT pg_reload_conf()"))
    try:
        yield "on" if was == "on" else "on for the run (off on this server)"
    finally:
        if was == "off":
            with engine.connect() as conn:
                conn.execute(text("ALTER SYSTEM RESET autovacuum"))
                conn.execute(text("SELECT pg_reload_conf()"))
        engine.dispose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default="postgresql,sqlite")
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--pending", type=int, default=50_000)
    ap.add_argument("--teams", type=int, default=10)
    ap.add_argument("--beat-batch", type=int, default=500,
                    help="jobs per heartbeat request (POST /api/v1/jobs/heartbeats); 0: one "
                    "request per job, as each Airflow operator beats its own")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--pg", default=os.environ.get(
        "AIRFLOW_GPU_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="service-scale-"))
    with autovacuum(args.pg if "postgresql" in args.db else None) as vacuum:
        results = [run_one(kind, args, tmp) for kind in args.db.split(",")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "service scale", "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "autovacuum": vacuum, "results": results}, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
