"""What a GPU task asks the scheduler for, from the task: the job's name, its idempotency
key, whom it is for, the roles' scheduler fields, and the expected runtime from history."""

from __future__ import annotations

import hashlib
import re
import statistics
from datetime import datetime

from ..scheduler_core.units import parse_duration

HISTORY = 5             # successful runs averaged (median) for the expected runtime
LAUNCH_KEYS = ("image", "command", "environment")


def job_name(dag_id: str, task_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{dag_id}.{task_id}")
    return name[:200]


def idempotency_key(ti) -> str:
    """One job per task try: a retry is a new job, a re-run of the same try is not."""
    key = f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/{ti.map_index}/{ti.try_number}"
    if len(key) > 200:
        key = key[:150] + "#" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return key


def task_user(context) -> str | None:
    """Whom a task's job is for: the user who triggered its DAG run, else the task's
    owner (unless Airflow's default owner), as a user name the job spec takes."""
    from airflow.sdk.definitions._internal.abstractoperator import DEFAULT_OWNER

    run = context.get("dag_run")
    task = context.get("task")
    owner = getattr(task, "owner", None)
    for name in (getattr(run, "triggering_user_name", None),
                 owner if owner and owner != DEFAULT_OWNER else None):
        if name:
            clean = re.sub(r"[^A-Za-z0-9_.-]", "-", str(name)).lstrip("_.-")[:200]
            if clean:
                return clean
    return None


def split_role(role: dict) -> tuple[dict, dict]:
    """A role as DAG authors write it: the scheduler's fields, and how it starts."""
    return ({k: v for k, v in role.items() if k not in LAUNCH_KEYS},
            {k: role[k] for k in LAUNCH_KEYS if k in role})


def runtime_from_history(client, name: str, job_class: str | None,
                         time_limit: str | int | None, log) -> int | None:
    """Median of the job's last successful runs in seconds, where the job class allows
    it; None without history."""
    from ..scheduler_core.plugins import default_registry

    jc = default_registry().job_classes.get(job_class or "")
    if jc is not None and not jc.runtime_from_history:
        return None
    runs = [j for j in client.jobs(state="succeeded", name=name, newest_first=True,
                                   limit=HISTORY) if j["started_at"] and j["finished_at"]]
    if not runs:
        return None
    took = statistics.median(
        (datetime.fromisoformat(j["finished_at"]) - datetime.fromisoformat(j["started_at"]))
        .total_seconds() for j in runs)
    seconds = max(1, round(took))
    if time_limit:                      # it is stopped there: never plan longer
        seconds = min(seconds, parse_duration(time_limit))
    log.info("expected runtime %ss: median of the last %d successful runs",
             seconds, len(runs))
    return seconds
