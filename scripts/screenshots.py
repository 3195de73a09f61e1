#!/usr/bin/env python3
"""Screenshots of the Airflow UI plugin's pages for docs/ui.md, in docs/images/.

Starts the stack the UI tests use (tests/plugin/stack.py: a scheduler-core holding running,
admitted, pending, unhealthy, drained and unreachable parts, and an Airflow API server
with the plugin), logs in through Airflow's login page in headless Chromium and captures
each page. Demo data only: to give the Teams chart a few hours of past, some jobs are run
now, then their times are moved back in the demo's own store.

    .venv/bin/python scripts/screenshots.py [--out docs/images] [--width 1280]

Needs Debian's chromium (scripts/ensure-chromium.sh). Takes about a minute.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import select, update  # noqa: E402

from airflow_gpu.scheduler_core.store.db import make_engine, sessions  # noqa: E402
from airflow_gpu.scheduler_core.store.models import EventRow, JobRow  # noqa: E402
from tests.plugin.bigstack import BigScheduler  # noqa: E402
from tests.plugin.browser import Browser  # noqa: E402
from tests.plugin.stack import AirflowApi, DemoScheduler, Stack, role  # noqa: E402

# (team, name, GPUs, started h ago, ran h): finished jobs that make the history
PAST = [("nlp", "embeddings-nightly", 4, 5.2, 1.4), ("vision", "hpo-trial-1", 4, 4.5, 1.5),
        ("vision", "hpo-trial-2", 4, 4.1, 1.6), ("nlp", "tokenizer-train", 2, 3.2, 0.8),
        ("vision", "resnet-baseline", 4, 2.0, 0.6), ("nlp", "eval-suite", 2, 1.1, 0.4)]
# how long ago the demo's live and pending jobs started (admitted) or were submitted, hours
AGES = {"data-prep": (5.8, 0.5), "vit-large": (2.2, None), "vision_pipeline.train": (1.3, None),
        "bert-finetune": (0.6, None), "etl-features": (0.2, None), "llm-pretrain": (0.7, None),
        "sweep-small": (0.3, None)}


def run_past_jobs(s: DemoScheduler) -> None:
    for team, name, gpus, _, _ in PAST:
        job = s.call("POST", "/api/v1/jobs", who=team, json={"spec": {
            "name": name, "expected_runtime": "10m",
            "roles": [role(gpus=gpus, gpu={"model": ["A100"]})]}})
        s.ids[name] = job["id"]
        s.wait_state(job["id"], ("admitted",))
        s.call("POST", f"/api/v1/jobs/{job['id']}/heartbeat", who=team)
        s.call("POST", f"/api/v1/jobs/{job['id']}/finish", who=team,
               json={"outcome": "succeeded", "exit_code": 0})


def move_back(s: DemoScheduler) -> None:
    """Shift the demo jobs' times (and their events) into the past."""
    now = datetime.now(UTC)
    plan = {name: (started, ran) for _, name, _, started, ran in PAST}
    plan.update(AGES)
    engine = make_engine(s.db)
    with sessions(engine).begin() as db:
        for name, (hours, ran) in plan.items():
            job_id = s.ids[name]
            row = db.get(JobRow, job_id)
            start = now - timedelta(hours=hours)
            shift = start - (row.admitted_at or row.submitted_at).replace(tzinfo=UTC)
            values = {"submitted_at": start - timedelta(minutes=4)}
            if row.admitted_at:
                values["admitted_at"] = start
                values["started_at"] = start if row.started_at else None
            if row.finished_at and ran is not None:
                values["finished_at"] = start + timedelta(hours=ran)
            db.execute(update(JobRow).where(JobRow.id == job_id).values(**values))
            for ev in db.scalars(select(EventRow).where(EventRow.job_id == job_id)):
                ev.at = ev.at.replace(tzinfo=UTC) + shift
    engine.dispose()
    time.sleep(1)          # a scheduling pass plans the pending jobs' ETAs again


def shrink(png: Path) -> None:
    """256 colours are plenty for these pages and make the files a third of the size
    (Pillow comes with the `plot` extra; without it the PNGs stay as captured)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as im:
        small = im.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE,
                                           dither=Image.Dither.NONE)
    small.save(png, optimize=True)


def login(b: Browser, url: str) -> None:
    b.open(f"{url}/")
    b.wait("document.querySelector('input[name=username]')")
    for field, value in (("username", "admin"), ("password", "admin-pass")):
        b.eval(f"document.querySelector('input[name={field}]').focus()")
        b.send("Input.insertText", text=value)
    b.eval("document.querySelector('button[type=submit]').click()")
    b.wait("document.cookie.includes('_token=')")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    ap.add_argument("--width", type=int, default=1280)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="airflow-gpu-shots-") as tmp:
        s = DemoScheduler(Path(tmp))
        airflow = None
        b = None
        try:
            s.set_up_hosts_and_teams()
            run_past_jobs(s)
            s.submit_jobs()
            s.report_utilization()
            move_back(s)
            airflow = AirflowApi(Path(tmp), s.connection(), refresh=5)
            b = Browser(args.width, 820)
            login(b, airflow.url)
            shots = [
                ("ui-in-airflow.png", "/plugin/gpu_cluster/gpu/cluster", False),
                ("ui-cluster.png", "/gpu/cluster", True),
                ("ui-queue.png", "/gpu/queue", True),
                ("ui-job.png", f"/gpu/jobs/{s.ids['vision_pipeline.train']}", True),
                ("ui-job-pending.png", f"/gpu/jobs/{s.ids['llm-pretrain']}", True),
                ("ui-teams.png", "/gpu/teams?window=6h", True),
            ]
            for name, path, full in shots:
                capture(b, airflow.url + path, args.out / name, full)
        finally:
            if b:
                b.close()
            if airflow:
                airflow.stop()
            s.stop()
        big_cluster_shots(Path(tmp) / "big", args)


def capture(b: Browser, url: str, png: Path, full: bool = True) -> None:
    """A page once its content is there (inside the Airflow UI's frame: once that frame's
    page is), as a PNG of 256 colours."""
    b.open(url)
    if "/plugin/" in url:
        b.wait("(f => f && f.contentDocument && "
               "f.contentDocument.querySelector('[data-host]'))"
               "(document.querySelector('iframe'))")
        time.sleep(1.5)          # the Airflow UI's own requests settle
    else:
        b.wait("document.querySelector('main section, #compact')")
    b.screenshot(png, full_page=full)
    shrink(png)
    print(f"{png}: {png.stat().st_size // 1024} KiB")


def big_cluster_shots(tmp: Path, args: argparse.Namespace) -> None:
    """The compact view of a 128-host cluster (tests/plugin/bigstack.py), whole and
    filtered, and a waiting gang's reservation."""
    stack = Stack(tmp, BigScheduler(tmp / "scheduler"), conn_id="gpu_scheduler_big",
                  refresh=5)
    b = None
    try:
        b = Browser(args.width, 820)
        login(b, stack.url)
        first = stack.scheduler.call("GET", "/api/v1/queue", params={"state": "pending"})[0]
        for name, path in (("ui-cluster-compact.png", "/gpu/cluster"),
                           ("ui-cluster-filtered.png", "/gpu/cluster?q=dgx-01&state=free"),
                           ("ui-job-reservation.png", f"/gpu/jobs/{first['id']}")):
            capture(b, stack.url + path, args.out / name)
    finally:
        if b:
            b.close()
        stack.stop()


if __name__ == "__main__":
    main()
