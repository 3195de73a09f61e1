"""Queue page: pending jobs in priority order with their reason and ETA, and the jobs
holding resources with their placement and elapsed against expected time."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from ...scheduler_core.plugins import default_registry
from ..format import age, due, duration, format_cpulist, parse_time, seconds_of, team_color

BLOCKERS_SHOWN = 12
LIVE_STATES = ("admitted", "running", "preempting")     # the states that hold resources
# what the service's requeue reasons mean, in words
REQUEUE_LABELS = {"idle": "idle GPUs", "gpu_fault": "GPU fault"}


def job_gpus(spec: dict) -> int:
    return sum(r.get("gpus", 0) * r.get("replicas", 1) for r in spec.get("roles", []))


def expected_runtime(spec: dict) -> int | None:
    """The spec's expected runtime, else its job class's default (what the engine plans
    with; the policy's default for class-less jobs is not visible here)."""
    seconds = seconds_of(spec.get("expected_runtime"))
    if seconds is None and spec.get("job_class"):
        jc = _job_classes().get(spec["job_class"])
        seconds = jc.default_runtime if jc else None
    return seconds


@cache
def _job_classes() -> dict:
    return default_registry().job_classes


def with_names(reason: str | None, names: dict[str, str]) -> str | None:
    """The scheduler names blocking jobs by id; people know them by name."""
    for job_id, name in names.items():
        if reason and job_id in reason:
            reason = reason.replace(job_id, name)
    return reason


def blockers(details: dict, names: dict[str, str]) -> dict[str, Any]:
    """The jobs holding the GPUs a pending job waits for (the reason's `held_by`, largest
    first), cut at BLOCKERS_SHOWN: a big gang can wait for a hundred jobs."""
    held = list((details.get("held_by") or {}).items())
    return {"blockers": [{"id": j, "name": names.get(j, j), "gpus": n}
                         for j, n in held[:BLOCKERS_SHOWN]],
            "blockers_more": max(0, len(held) - BLOCKERS_SHOWN)
            + int(details.get("held_by_more") or 0)}


def victims(code: str | None, details: dict, names: dict[str, str]) -> list[dict[str, Any]]:
    """The jobs a pending job preempts and waits for (code `Preempting`)."""
    if code != "Preempting":
        return []
    return [{"id": j, "name": names.get(j, j)} for j in details.get("victims") or []]


def requeue_label(reason: str | None) -> str | None:
    return None if not reason else REQUEUE_LABELS.get(reason, reason)


def requeued(job: dict) -> str | None:
    """Why a pending job is back in the queue: "preempted 2x, requeued", "requeued: GPU
    fault" or "requeued: idle GPUs" (the idle-GPU policy stopped it)."""
    if job.get("requeue_reason") == "preempted":
        return f"preempted {job.get('preemptions') or 1}x, requeued"
    if job.get("requeue_reason"):
        return f"requeued: {requeue_label(job['requeue_reason'])}"
    return None


def idle_stop(job: dict) -> bool:
    """Being stopped by the idle-GPU policy: preempting with no preemptor."""
    return job.get("state") == "preempting" and not job.get("preempted_by") and \
        (job.get("preempt_reason") or "").startswith("idle")


def pending_row(job: dict, now: datetime, names: dict[str, str]) -> dict[str, Any]:
    why = job.get("pending") or {}
    details = why.get("details") or {}
    eta = why.get("eta_seconds")
    return {
        "rank": job.get("rank"), "band": job.get("band"), "score": job.get("score"),
        "id": job["id"], "name": job["name"], "team": job["team"],
        "color": team_color(job["team"]), "priority": job["priority"],
        "job_class": job["spec"].get("job_class"), "gpus": job_gpus(job["spec"]),
        "code": why.get("code"), "due": due(job["spec"], now),
        "reason": with_names(why.get("reason"), names) or "waiting for the next pass",
        **blockers(details, names),
        "victims": victims(why.get("code"), details, names),
        "requeued": requeued(job),
        "eta_seconds": eta, "eta": "unknown" if eta is None else
        ("now" if eta == 0 else f"in {duration(eta)}"),
        "waiting": duration(age(job["submitted_at"], now)),
    }


def live_row(job: dict, now: datetime, names: dict[str, str] | None = None
             ) -> dict[str, Any]:
    names = names or {}
    started = job.get("started_at") or job.get("admitted_at")
    elapsed = age(started, now)
    expected = expected_runtime(job["spec"])
    by_host: dict[str, list[int]] = {}
    for r in job.get("replicas", []):
        by_host.setdefault(r["host"], []).extend(r["gpus"])
    return {
        "id": job["id"], "name": job["name"], "team": job["team"],
        "color": team_color(job["team"]), "state": job["state"],
        "gpus": job_gpus(job["spec"]),
        # admitted beyond its team's guarantee, on GPUs other teams leave idle
        "borrowed": bool(job.get("borrowed")),
        # flagged by the idle-GPU policy: all its GPUs under the threshold since then
        "idle": bool(job.get("idle_flagged_at")),
        "idle_for": None if not job.get("idle_flagged_at")
        else duration(age(job.get("idle_since") or job["idle_flagged_at"], now)),
        "idle_stop": idle_stop(job),
        "preempted_by": None if job["state"] != "preempting" or not job.get("preempted_by")
        else {
            "id": job.get("preempted_by"),
            "name": names.get(job.get("preempted_by"), job.get("preempted_by"))},
        "stops_in": None if job["state"] != "preempting"
        else duration(-(age(job.get("preempt_deadline_at"), now) or 0)),
        "placement": [{"host": h, "gpus": f"GPU {format_cpulist(g)}" if g else "CPUs only"}
                      for h, g in by_host.items()],
        "elapsed": duration(elapsed), "expected": duration(expected),
        "progress": None if not expected or elapsed is None
        else min(100, round(100 * elapsed / expected)),
        "overrun": bool(expected and elapsed is not None and elapsed > expected),
    }


def queue_page(pending: list[dict], live: list[dict], now: datetime) -> dict[str, Any]:
    """`pending`: GET /api/v1/queue?state=pending, in the scheduler's order (its `rank`;
    held jobs and those it does not queue come last, without one)."""
    ordered = sorted(pending, key=lambda j: (j.get("rank") is None, j.get("rank") or 0))
    running = sorted(live, key=lambda j: parse_time(j.get("admitted_at")
                                                    or j["submitted_at"]))
    names = {j["id"]: j["name"] for j in live}
    # a preempting job's preemptor waits in the queue
    preemptors = {j["id"]: j["name"] for j in pending
                  if (j.get("pending") or {}).get("code") == "Preempting"}
    return {
        "pending": [pending_row(j, now, names) for j in ordered],
        "live": [live_row(j, now, {**names, **preemptors}) for j in running],
        "pending_gpus": sum(job_gpus(j["spec"]) for j in pending),
        "live_gpus": sum(job_gpus(j["spec"]) for j in live),
    }
