"""Job page: where each replica runs (host, GPUs, cores, NUMA node, NIC), the job's
events, why it waits, and the way back to the Airflow task instance."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from ..format import age, duration, format_cpulist, format_size, seconds_of, team_color
from .queue import blockers, expected_runtime, job_gpus, victims, with_names


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


def task_instance_url(ti: dict, airflow_root: str = "") -> str:
    """The task instance's page in the Airflow 3 UI."""
    url = (f"{airflow_root}/dags/{quote(ti['dag_id'], safe='')}/runs/"
           f"{quote(ti['run_id'], safe='')}/tasks/{quote(ti['task_id'], safe='')}")
    return url + (f"/mapped/{ti['map_index']}" if ti["map_index"] >= 0 else "")


def replica_row(r: dict, hosts: dict[str, dict]) -> dict[str, Any]:
    host = hosts.get(r["host"], {})
    numa = sorted(r.get("memory_by_numa", {}), key=lambda n: int(n) if n.isdigit() else n)
    return {
        "role": r["role"], "index": r["index"], "host": r["host"],
        "rack": host.get("rack"), "switch": host.get("switch"),
        "gpus": format_cpulist(r["gpus"]) if r["gpus"] else "—",
        "cpus": format_cpulist(r["cpus"]) if r["cpus"] else "—",
        "n_cpus": len(r["cpus"]),
        "numa_nodes": ", ".join(numa) or "—",
        "memory": ", ".join(f"{format_size(b)} on node {n}"
                            for n, b in r.get("memory_by_numa", {}).items()) or "—",
        "nics": ", ".join(r.get("nics", [])) or "—",
        "live": r.get("live", True),
    }


def preemption(job: dict, names: dict[str, str], now: datetime) -> dict[str, Any] | None:
    """Borrowing, preemption and requeues of the job, or None when it has none."""
    by = job.get("preempted_by")
    out = {
        "borrowed": bool(job.get("borrowed")) and job["state"] in (
            "admitted", "running", "preempting"),
        "preempted_by": None if not by else {"id": by, "name": names.get(by, by)},
        "preempt_reason": job.get("preempt_reason"),
        "preemptions": job.get("preemptions") or 0,
        "requeue_reason": job.get("requeue_reason"),
        "attempt": job.get("attempt"),
        # while preempting: the signal, the grace until SIGKILL, the forced requeue
        "signal": job.get("preempt_signal"),
        "grace": None if job.get("preempt_grace") is None else duration(job["preempt_grace"]),
        "deadline_in": None if not job.get("preempt_deadline_at")
        else duration(-(age(job["preempt_deadline_at"], now) or 0)),
    }
    shown = ("borrowed", "preempted_by", "preempt_reason", "preemptions", "requeue_reason")
    return out if any(out[k] for k in shown) else None


def job_page(job: dict, explain: dict, cluster: dict, live: list[dict], now: datetime,
             airflow_root: str = "", pending: list[dict] = ()) -> dict[str, Any]:
    """`live`: the admitted, running and preempting jobs, to name the ones this job waits
    for; `pending`: the pending jobs, to name the one that preempted it."""
    hosts = {h["name"]: h for h in cluster.get("hosts", [])}
    names = {j["id"]: j["name"] for j in live}
    ti = task_instance(job.get("idempotency_key"))
    started = job.get("started_at") or job.get("admitted_at")
    ended = job.get("finished_at")
    elapsed = None if not started else (
        age(started, now) - (age(ended, now) or 0) if ended else age(started, now))
    why = job.get("pending") or {}
    return {
        "id": job["id"], "name": job["name"], "team": job["team"],
        "color": team_color(job["team"]), "state": job["state"],
        "priority": job["priority"], "job_class": job["spec"].get("job_class"),
        "gpus": job_gpus(job["spec"]),
        "roles": [{"name": r.get("name"), "replicas": r.get("replicas", 1),
                   "gpus": r.get("gpus", 0), "cpus": r.get("cpus"),
                   "memory": r.get("memory")} for r in job["spec"].get("roles", [])],
        "placement": job["spec"].get("placement") or {},
        "times": {k: job.get(k) for k in ("submitted_at", "admitted_at", "started_at",
                                          "finished_at", "lease_expires_at")},
        "elapsed": duration(elapsed), "expected": duration(expected_runtime(job["spec"])),
        # as admitted (backfill may have cut it), else what the spec asks
        "limit": duration(job.get("time_limit_s") or seconds_of(job["spec"].get("time_limit")))
        if job.get("time_limit_s") or job["spec"].get("time_limit") else None,
        "limit_cut_by": names.get(job.get("limit_cut_by"), job.get("limit_cut_by")),
        "waiting": duration(age(job["submitted_at"], now)),
        "exit_code": job.get("exit_code"),
        "reason": with_names(explain.get("reason") or why.get("reason"), names),
        "blockers": blockers(explain.get("details") or {}, names),
        "code": explain.get("code") or why.get("code"),
        "eta": None if explain.get("eta_seconds") is None
        else duration(explain["eta_seconds"]),
        "details": explain.get("details") or {},
        "victims": victims(explain.get("code") or why.get("code"),
                           explain.get("details") or why.get("details") or {}, names),
        "preemption": preemption(job, {**{j["id"]: j["name"] for j in pending}, **names},
                                 now),
        "replicas": [replica_row(r, hosts) for r in job.get("replicas", [])],
        "events": [{"at": e["at"], "kind": e["kind"], "message": e["message"]}
                   for e in explain.get("events", [])],
        "task_instance": ti,
        "task_instance_url": task_instance_url(ti, airflow_root) if ti else None,
    }
