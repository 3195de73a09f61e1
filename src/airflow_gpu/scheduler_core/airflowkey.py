"""The Airflow task instance a job came from, read back from the GPU operators'
idempotency key `dag/task/run/map_index/try` (operators/base.py writes it): the UI links
to it, and webhook bodies carry it."""

from __future__ import annotations

from typing import Any


def task_instance(key: str | None) -> dict[str, Any] | None:
    """Dag, task, run, map index and try from the operators' idempotency key
    `dag/task/run/map_index/try` (dag and task ids hold no '/', a run id may). None for
    jobs not submitted by Airflow, or keys shortened with a hash (over 200 characters)."""
    if not key or "#" in key:
        return None
    parts = key.split("/")
    if len(parts) < 5:
        return None
    dag_id, task_id, *run, map_index, try_number = parts
    if not (map_index.lstrip("-").isdigit() and try_number.isdigit()):
        return None
    return {"dag_id": dag_id, "task_id": task_id, "run_id": "/".join(run),
            "map_index": int(map_index), "try_number": int(try_number)}
