"""`airflow-gpu status` (and `cancel`): a job's state, its placement now, and the
placements of its earlier admissions as history. A requeued job (preempted, idle, a GPU
fault, `requeue`) keeps the grants of the admissions that ended, marked `live: false`
in the API; they are never shown as where the job is now."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ...scheduler_core.engine.topology import format_cpulist
from ...scheduler_core.units import format_duration

LIVE = ("admitted", "running", "preempting")


def label(j: dict) -> str:
    """A job's name; an array element's with its index, as its references write it:
    sweep_3."""
    return j["name"] if j.get("array_index") is None else f"{j['name']}_{j['array_index']}"


def _gpus(r: dict) -> str:
    return (",".join(map(str, r["gpus"]))
            or "; ".join(m["label"] for m in r.get("mig", [])) or "-")


def split(j: dict) -> tuple[list[dict], list[dict]]:
    """(its placement now, its earlier admissions' grants): a live job's live grants; an
    ended job's last admission (where it ran); a pending job has none."""
    reps = j.get("replicas", [])
    if j["state"] in LIVE:
        now = [r for r in reps if r.get("live", True)]
    elif j["state"] == "pending":
        now = []
    else:
        last = max((r.get("admission") or 0 for r in reps), default=0)
        now = [r for r in reps if (r.get("admission") or 0) == last]
    return now, [r for r in reps if not any(r is x for x in now)]


def _eta(j: dict) -> str:
    p = j.get("pending") or {}
    return format_duration(p["eta_seconds"]) if p.get("eta_seconds") is not None else "-"


def _at(value: str | None) -> str:
    """An API time as 2026-12-01 16:40:05 (UTC)."""
    return value[:19].replace("T", " ") if value else "-"


def due_line(j: dict) -> str | None:
    """Its pipeline's deadline and the slack (the API's pipeline_deadline_at and
    deadline_slack_s), apart from its time limit: "pipeline deadline 2026-12-06 06:00:00
    (UTC): 1h30m to spare", "...: at risk, about 30m late"."""
    if not j.get("pipeline_deadline_at"):
        return None
    line = f"pipeline deadline {_at(str(j['pipeline_deadline_at']))} (UTC)"
    slack = j.get("deadline_slack_s")
    if slack is None:
        return line
    if j["state"] not in LIVE and j["state"] != "pending":
        return line + (f": met, {format_duration(slack)} to spare" if slack >= 0
                       else f": missed by {format_duration(-slack)}")
    if j.get("deadline_at_risk"):
        return line + (f": at risk, about {format_duration(-slack)} late" if slack < 0
                       else f": at risk ({format_duration(slack)} of slack left)")
    return line + f": {format_duration(slack)} to spare"


def job_table(j: dict) -> Table | Group:
    now, history = split(j)
    title = f"Job {j['id']} ({label(j)}, team {j['team']}): {j['state']}" + (
        f" - element {j['array_index']} of array {j['array_id']}" if j.get("array_id") else "")
    p = j.get("pending")
    why = f"{p['code']}: {p['reason']} (ETA {_eta(j)})" if p and p.get("code") else None
    due = due_line(j)
    why = "\n".join(x for x in (why, due) if x) or None
    parts: list = []
    if now:
        t = Table(title=title, title_justify="left", caption=why)
        for col in ("role", "#", "host", "GPUs", "CPUs", "NICs"):
            t.add_column(col)
        for r in now:
            t.add_row(r["role"], str(r["index"]), r["host"], _gpus(r),
                      format_cpulist(r["cpus"]), ",".join(r["nics"]) or "-")
        parts.append(t)
    else:     # lines of their own: an empty table is narrow and would wrap them
        requeued = j.get("requeue_reason") if j["state"] == "pending" else None
        parts += [Text(title), Text(f"no placement now ({j['state']}"
                                    + (f", requeued: {requeued}" if requeued else "") + ")")]
        parts += [Text(why)] if why else []
    if history:
        h = Table(title="Earlier admissions (ended: history, not held now)",
                  title_justify="left")
        for col in ("admission", "role", "#", "host", "GPUs", "granted", "released"):
            h.add_column(col)
        for r in history:
            h.add_row(str(r.get("admission") or "-"), r["role"], str(r["index"]), r["host"],
                      _gpus(r), _at(r.get("granted_at")), _at(r.get("released_at")))
        parts.append(h)
    return parts[0] if len(parts) == 1 else Group(*parts)
