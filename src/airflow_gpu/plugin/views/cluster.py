"""Cluster page: racks -> switches -> hosts -> NUMA nodes -> GPU cells; from COMPACT_FROM
hosts on, a compact view (one small cell per GPU, a row per host), and filters (search,
GPU state, rack, team) carried in the URL so refreshes and links keep them."""

from __future__ import annotations

from typing import Any

from ..format import parse_time, team_color

# Utilization values the node agent adds to each GPU of the cluster view (absent for hosts
# without an agent, or declared ones): shown when present, never required.
UTIL_KEYS = ("utilization_gpu", "utilization_memory", "memory_used_bytes", "power_watts",
             "temperature_c")
# the full view's host cards fill a screen with about a dozen hosts
COMPACT_FROM = 24
STATES = ("free", "held", "mig", "unhealthy", "drained", "unreachable")
VIEWS = ("full", "compact")


def cluster_page(cluster: dict, live_jobs: list[dict], view: str | None = None,
                 q: str | None = None, state: str | None = None, rack: str | None = None,
                 team: str | None = None) -> dict[str, Any]:
    """`cluster` is GET /api/v1/cluster; `live_jobs` the admitted and running jobs (names).
    The summary counts the whole cluster; the filters pick the hosts shown."""
    names = {j["id"]: j["name"] for j in live_jobs}
    hosts = [host_cell(h, names) for h in cluster.get("hosts", [])]
    shown = [h for h in hosts if matches(h, q, state, rack, team)]
    racks: dict[str, dict[str, list[dict]]] = {}
    for h in shown:            # the cluster file's order, grouped by rack then switch
        racks.setdefault(h["rack"] or "(no rack)", {}).setdefault(
            h["switch"] or "(no switch)", []).append(h)
    teams = sorted({t for h in hosts for n in h["numa"] for g in n["gpus"]
                    for t in (g["team"], *(d["team"] for d in g["mig"])) if t})
    filters = {"q": q or "", "state": state or "", "rack": rack or "", "team": team or ""}
    return {
        "cluster": cluster.get("cluster"),
        "summary": summary(hosts),
        "reservations": [reservation_cell(r) for r in cluster.get("reservations") or []],
        "teams": [{"name": t, "color": team_color(t)} for t in teams],
        "view": view or ("compact" if len(hosts) >= COMPACT_FROM else "full"),
        "filters": filters, "filtered": any(filters.values()), "shown_hosts": len(shown),
        "options": {"states": STATES, "teams": teams, "views": VIEWS,
                    "racks": list(dict.fromkeys(h["rack"] or "(no rack)" for h in hosts))},
        "racks": [{"name": name, "switches": [
            {"name": sw, "hosts": hs, **counts(hs)} for sw, hs in switches.items()],
            **counts([h for hs in switches.values() for h in hs])}
            for name, switches in racks.items()],
    }


def matches(h: dict, q: str | None, state: str | None, rack: str | None,
            team: str | None) -> bool:
    """Search: host, model, rack, switch or NVLink domain, or a job name, id or team on
    its GPUs (case-insensitive substring). State: a host with at least one GPU in that state."""
    gpus = [g for n in h["numa"] for g in n["gpus"]]
    if rack and (h["rack"] or "(no rack)") != rack:
        return False
    if team and not any(team in (g["team"], *(d["team"] for d in g["mig"])) for g in gpus):
        return False
    if state and not any(g["state"] == state for g in gpus):
        return False
    if q:
        needle = q.strip().lower()
        words = [h["name"], h["model"], h["rack"], h["switch"], h["nvlink_domain"],
                 *(w for g in gpus for w in (g["job"], g["job_name"], g["team"])),
                 *(w for g in gpus for d in g["mig"] for w in (d["job"], d["job_name"],
                                                              d["team"], d["profile"]))]
        return any(needle in str(w).lower() for w in words if w)
    return True


def gpu_state(g: dict) -> str:
    """One word per GPU, as the filter and the compact cells use it."""
    if not g["healthy"]:
        return "unhealthy"
    if g["mig"]:                # split into MIG devices: never free or held whole
        return "mig"
    return "held" if g["job"] else g["idle"]


def counts(hosts: list[dict]) -> dict[str, int]:
    return {"n_hosts": len(hosts), "gpus_total": sum(h["gpus_total"] for h in hosts),
            "gpus_free": sum(h["gpus_free"] for h in hosts)}


def host_cell(h: dict, names: dict[str, str]) -> dict[str, Any]:
    groups = (h.get("nvlink") or {}).get("groups") or []
    group_of = {g: i for i, members in enumerate(groups) for g in members}
    reachable = h.get("reachable", True) is not False
    # an idle GPU of a drained or unreachable host takes no work: it is not "free"
    idle = "unreachable" if not reachable else "drained" if h.get("drained") else "free"
    gpus = [gpu_cell(g, names, group_of.get(g["index"]), len(groups), idle)
            for g in h.get("gpus", [])]
    numa: dict[int | None, list[dict]] = {}
    for g in gpus:
        numa.setdefault(g["numa_node"], []).append(g)
    status = ("unreachable" if not reachable else "drained" if h.get("drained")
              else "degraded" if any(not g["healthy"] for g in gpus) else "ok")
    return {
        "name": h["name"], "model": h.get("model"), "rack": h.get("rack"),
        "switch": h.get("switch"), "drained": bool(h.get("drained")), "reachable": reachable,
        "drain_reason": h.get("drain_reason") if h.get("drained") else None,
        # hosts sharing an NVLink fabric beyond the host (GB200 NVL72 trays of a rack)
        "nvlink_domain": h.get("nvlink_domain"),
        "status": status,
        "nvlink": nvlink_label(h.get("nvlink"), len(gpus)),
        "numa": [{"node": n, "gpus": cells} for n, cells in numa.items()],
        "gpus_total": len(gpus),
        "gpus_held": sum(1 for g in gpus if g["job"]),
        "gpus_unhealthy": sum(1 for g in gpus if not g["healthy"]),
        "gpus_free": 0 if idle != "free" else sum(1 for g in gpus if not g["job"]
                                                  and g["healthy"] and not g["mig"]),
        "mig_devices": sum(len(g["mig"]) for g in gpus),
        "mig_free": 0 if idle != "free" else sum(1 for g in gpus if g["healthy"]
                                                 for d in g["mig"] if not d["job"]),
        # the admins' reservation of the host now, and its next one
        "reservations": [reservation_cell(r) for r in h.get("reservations") or []],
    }


def reservation_cell(r: dict) -> dict[str, Any]:
    """A reservation as the page shows it: `fw (maintenance) until 12-24 08:00 UTC`."""
    what = "maintenance" if r.get("maint") else ", ".join(r.get("teams") or ())
    start, end = _minute(r.get("start")), _minute(r.get("end"))
    when = (f"until {end}" if r.get("state") == "active" else f"{start} to {end}")
    return {**r, "what": what, "label": f"{r['name']} ({what}) {when} UTC",
            "hosts_text": ", ".join(r.get("hosts") or ())}


def _minute(value: str | None) -> str:
    t = parse_time(value)
    return "—" if t is None else t.strftime("%m-%d %H:%M")


def gpu_cell(g: dict, names: dict[str, str], group: int | None, n_groups: int,
             idle: str = "free") -> dict:
    job = g.get("job")
    cell = {
        "idle": idle,
        "index": g["index"], "name": g.get("name"), "numa_node": g.get("numa_node"),
        "job": job, "job_name": names.get(job, job) if job else None,
        "team": g.get("team"), "color": team_color(g.get("team")),
        "healthy": g.get("healthy", True) is not False,
        "health_reason": g.get("health_reason"),
        # a group letter only where the host has more than one group (DGX-1 quads)
        "nvlink_group": chr(ord("A") + group) if group is not None and n_groups > 1 else None,
        **{k: g.get(k) for k in UTIL_KEYS},
        # a GPU in MIG mode: its devices, each held by a job or free
        "mig": [mig_cell(d, names) for d in g.get("mig") or []],
    }
    return {**cell, "state": gpu_state(cell)}


def mig_cell(d: dict, names: dict[str, str]) -> dict:
    job, team = d.get("job"), d.get("team")
    return {"index": d.get("index"), "profile": d.get("profile"), "uuid": d.get("uuid"),
            "label": d.get("label") or f"MIG {d.get('profile')} #{d.get('index')}",
            "job": job, "job_name": names.get(job, job) if job else None, "team": team,
            "color": team_color(team)}


def nvlink_label(nvlink: dict | None, n_gpus: int) -> dict[str, Any]:
    if not nvlink:
        return {"fabric": None, "groups": [], "text": "NVLink: not reported"}
    fabric, groups = nvlink.get("fabric"), nvlink.get("groups") or []
    if groups and all(len(g) == 1 for g in groups):
        text = "no NVLink between GPUs"
    elif len(groups) == 1:
        text = f"NVLink ({fabric}): all {n_gpus} GPUs in one group"
    else:
        parts = [f"{chr(ord('A') + i)}: GPU {_span(g)}" for i, g in enumerate(groups)]
        text = f"NVLink ({fabric}) groups " + ", ".join(parts)
    return {"fabric": fabric, "groups": groups, "text": text}


def _span(members: list[int]) -> str:
    if members == list(range(members[0], members[-1] + 1)) and len(members) > 1:
        return f"{members[0]}-{members[-1]}"
    return ",".join(map(str, members))


def summary(hosts: list[dict]) -> dict[str, int]:
    return {
        "hosts": len(hosts),
        "gpus_total": sum(h["gpus_total"] for h in hosts),
        "gpus_held": sum(h["gpus_held"] for h in hosts),
        "gpus_free": sum(h["gpus_free"] for h in hosts),
        "gpus_unhealthy": sum(h["gpus_unhealthy"] for h in hosts),
        "hosts_drained": sum(1 for h in hosts if h["drained"]),
        "hosts_unreachable": sum(1 for h in hosts if not h["reachable"]),
        "mig_devices": sum(h["mig_devices"] for h in hosts),
        "mig_free": sum(h["mig_free"] for h in hosts),
    }
