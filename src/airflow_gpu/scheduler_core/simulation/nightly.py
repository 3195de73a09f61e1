"""A derived workload for deadlines: a shared trace's jobs as background, and nightly
pipelines mixed in (bench/deadlines.py).

Each night a few pipelines start between midnight and 2 am: ETL, then training, then
validation, sometimes an evaluation beside the validation and an export after it (3-5
GPU tasks). Each is due a random 1.2-3x its critical path after it starts: a morning
report that must be ready. Everything comes from one seeded RNG, so a seed gives the
same workload every run.
"""

from __future__ import annotations

import dataclasses
import random

from .pipelines import earliest_ends
from .trace import TraceJob

DAY = 86400.0

# task name, GPUs (choices), runtime range in seconds, upstream tasks
TASKS = (("etl", (1, 2), (1200, 3600), ()),
         ("train", (4, 8, 8, 16), (3600, 4 * 3600), ("etl",)),
         ("validate", (1,), (600, 1800), ("train",)))
EXTRA = (("evaluate", (1, 2), (900, 2700), ("train",)),
         ("export", (1,), (600, 1200), ("validate",)))


def window(trace: list[TraceJob], start: float, span: float) -> list[TraceJob]:
    """The jobs submitted in [start, start + span), their submit times from its start."""
    return [dataclasses.replace(t, submit=t.submit - start)
            for t in trace if start <= t.submit < start + span]


def pipelines(days: int, per_night: int, seed: int, slack: tuple[float, float] = (1.2, 3.0),
              team: str = "nightly") -> list[TraceJob]:
    """`per_night` pipelines on each of `days` nights (job ids n<day>-<k>-<task>)."""
    rng = random.Random(seed)
    out: list[TraceJob] = []
    for day in range(days):
        for k in range(per_night):
            start = round(day * DAY + rng.uniform(0, 2 * 3600))
            run = f"n{day}-{k}"
            tasks = list(TASKS) + list(EXTRA[:rng.randint(0, 2)])
            jobs = [TraceJob(f"{run}-{name}", start, float(round(rng.uniform(*span))),
                             rng.choice(gpus), team, dag_run=run,
                             upstream=tuple(f"{run}-{u}" for u in ups))
                    for name, gpus, span, ups in tasks]
            due = start + rng.uniform(*slack) * (earliest_ends(jobs)[run] - start)
            out.extend(dataclasses.replace(j, deadline=float(round(due))) for j in jobs)
    return out


def mixed(background: list[TraceJob], nightly: list[TraceJob]) -> list[TraceJob]:
    """Both, by submit time (background first on ties), with lines numbered again."""
    jobs = sorted(background + nightly, key=lambda t: t.submit)
    return [dataclasses.replace(t, line=i + 2) for i, t in enumerate(jobs)]


def write_trace(jobs: list[TraceJob], path: str) -> None:
    """The workload as a trace file `simulate --trace` reads."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_time", "duration", "num_gpus", "team", "dag_run",
                    "upstream", "deadline"])
        for t in jobs:
            w.writerow([t.job_id, t.submit, t.duration, t.gpus, t.team, t.dag_run or "",
                        ";".join(t.upstream), "" if t.deadline is None else t.deadline])
