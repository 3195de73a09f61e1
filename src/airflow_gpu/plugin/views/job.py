"""Job page: where each replica runs (host, GPUs, cores, NUMA node, NIC), the job's
events, why it waits, its GPU accounting and utilization over time, the idle-GPU flag,
and the way back to the Airflow task instance."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from ...scheduler_core.airflowkey import task_instance
from ..format import (
    age,
    due,
    duration,
    format_cpulist,
    format_size,
    parse_time,
    seconds_of,
    team_color,
)
from .queue import (
    LIVE_STATES,
    blockers,
    expected_runtime,
    idle_stop,
    job_gpus,
    requeue_label,
    victims,
    with_names,
)
from .teams import number
from .usage_chart import usage_chart


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
        # stopped by the idle-GPU policy (no preemptor), not by another job
        "idle_stop": idle_stop(job),
        "borrowed": bool(job.get("borrowed")) and job["state"] in LIVE_STATES,
        "preempted_by": None if not by else {"id": by, "name": names.get(by, by)},
        "preempt_reason": job.get("preempt_reason"),
        "preemptions": job.get("preemptions") or 0,
        "requeue_reason": job.get("requeue_reason"),
        "requeue_label": requeue_label(job.get("requeue_reason")),
        "attempt": job.get("attempt"),
        # while preempting: the signal, the grace until SIGKILL, the forced requeue
        "signal": job.get("preempt_signal"),
        "grace": None if job.get("preempt_grace") is None else duration(job["preempt_grace"]),
        "deadline_in": None if not job.get("preempt_deadline_at")
        else duration(-(age(job["preempt_deadline_at"], now) or 0)),
    }
    shown = ("borrowed", "preempted_by", "preempt_reason", "preemptions", "requeue_reason")
    return out if any(out[k] for k in shown) else None


def idle_flag(job: dict, now: datetime) -> dict[str, Any] | None:
    """The idle-GPU policy's flag on the job (None: not flagged)."""
    if not job.get("idle_flagged_at"):
        return None
    since = job.get("idle_since") or job["idle_flagged_at"]
    return {"since": _utc(since), "flagged_at": _utc(job["idle_flagged_at"]),
            "for": duration(age(since, now)), "live": job["state"] in LIVE_STATES}


def _utc(value: str) -> str:
    t = parse_time(value)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t else "—"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{number(float(value))} %"


def energy(joules: float | None) -> str:
    """Joules below 0.1 kWh, kWh above."""
    if joules is None:
        return "—"
    return f"{joules / 3.6e6:.2f} kWh" if joules >= 3.6e5 else f"{round(joules):,} J"


def gpu_hours(hours: float | None) -> str:
    if hours is None:
        return "—"
    return "< 0.01" if 0 < hours < 0.01 else f"{hours:,.2f}"


def usage_totals(u: dict) -> dict[str, Any]:
    """One set of usage figures (the job's, or a replica's) as the page shows them;
    sampled ones are "—" where no node agent reported the GPUs."""
    sampled = u.get("sampled_gpu_seconds") or 0
    zero = u.get("zero_utilization_seconds") or 0
    joules = u.get("energy_joules") or 0
    return {
        "gpu_hours": gpu_hours(u.get("gpu_hours")),
        "sampled": duration(sampled),
        "utilization_mean": percent(u.get("utilization_mean")),
        "utilization_peak": percent(u.get("utilization_peak")),
        "memory_peak": "—" if u.get("memory_peak_bytes") is None
        else format_size(u["memory_peak_bytes"]),
        "energy": energy(joules) if joules or sampled else "—",
        "zero_time": duration(zero) if sampled else "—",
        "zero_pct": None if not sampled else number(100.0 * zero / sampled),
    }


def accounting(usage: dict | None, error: str | None = None) -> dict[str, Any]:
    """The job's accounting section: totals, per replica, and the utilization chart; when
    the service could not answer (an older one has no usage endpoint) only why."""
    if usage is None:
        return {"available": False, "error": error or "no usage reported"}
    return {
        "available": True, **usage_totals(usage),
        "replicas": [{"role": r.get("role"), "index": r.get("index"), "host": r.get("host"),
                      "gpus": format_cpulist(r["gpus"]) if r.get("gpus") else "—",
                      **usage_totals(r)} for r in usage.get("replicas") or []],
        "chart": usage_chart(usage.get("series") or []),
    }


def reservation(details: dict, eta: float | None, hosts: dict[str, dict],
                names: dict[str, str], now: datetime) -> dict[str, Any] | None:
    """The resources the scheduler holds back for a pending job, the jobs on them now, and
    when it plans to start it there (the reason's `reserved_hosts`/`reserved_gpus` and
    ETA); None without one."""
    reserved = details.get("reserved_hosts")
    if not reserved:
        return None
    gpus = details.get("reserved_gpus") or {}
    start = None if eta is None else now + timedelta(seconds=eta)
    rows = []
    for name in reserved:
        host = hosts.get(name, {})
        mine = set(gpus.get(name) or [])
        on = list(dict.fromkeys(g["job"] for g in host.get("gpus", [])
                                if g.get("job") and (not mine or g["index"] in mine)))
        rows.append({"host": name, "rack": host.get("rack"), "switch": host.get("switch"),
                     "gpus": f"GPU {format_cpulist(sorted(mine))}" if mine else None,
                     "held_by": [{"id": j, "name": names.get(j, j)} for j in on]})
    return {"hosts": rows, "start": start.strftime("%Y-%m-%d %H:%M UTC") if start else None,
            "in": None if eta is None else duration(eta), "tier": details.get("tier")}


def job_page(job: dict, explain: dict, cluster: dict, live: list[dict], now: datetime,
             airflow_root: str = "", pending: list[dict] = (), usage: dict | None = None,
             usage_error: str | None = None) -> dict[str, Any]:
    """`live`: the admitted, running and preempting jobs, to name the ones this job waits
    for; `pending`: the pending jobs, to name the one that preempted it; `usage`: the
    service's usage of the job (None, with `usage_error`, when it could not answer)."""
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
        # as admitted, else what the spec asks
        "limit": duration(job.get("time_limit_s") or seconds_of(job["spec"].get("time_limit")))
        if job.get("time_limit_s") or job["spec"].get("time_limit") else None,
        "limit_cut_by": names.get(job.get("limit_cut_by"), job.get("limit_cut_by")),
        "waiting": duration(age(job["submitted_at"], now)),
        "exit_code": job.get("exit_code"),
        "reason": with_names(explain.get("reason") or why.get("reason"), names),
        **blockers(explain.get("details") or {}, names),
        "code": explain.get("code") or why.get("code"), "due": due(job["spec"], now),
        "eta": None if explain.get("eta_seconds") is None
        else duration(explain["eta_seconds"]),
        "details": explain.get("details") or {},
        "reservation": None if job["state"] != "pending" else reservation(
            explain.get("details") or why.get("details") or {},
            explain.get("eta_seconds", why.get("eta_seconds")), hosts, names, now),
        "victims": victims(explain.get("code") or why.get("code"),
                           explain.get("details") or why.get("details") or {}, names),
        "preemption": preemption(job, {**{j["id"]: j["name"] for j in pending}, **names},
                                 now),
        "replicas": [replica_row(r, hosts) for r in job.get("replicas", [])],
        "events": [{"at": e["at"], "kind": e["kind"], "message": e["message"]}
                   for e in explain.get("events", [])],
        "task_instance": ti,
        "task_instance_url": task_instance_url(ti, airflow_root) if ti else None,
        "idle": idle_flag(job, now),
        "accounting": accounting(usage, usage_error),
    }
