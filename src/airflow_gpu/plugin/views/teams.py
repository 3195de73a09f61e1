"""Teams page: GPUs held now against the team's guarantee (quota), what it may borrow
beyond it, what it borrows and lends now, fair share, and usage over a past window as
small SVG charts (drawn on the server: no chart library, no CDN)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..format import duration, team_color
from .usage_history import gpu_hours, usage_history

WIDTH, HEIGHT = 360, 90      # chart size in SVG units


def teams_page(teams: list[dict], jobs: list[dict], cluster: dict, now: datetime,
               window: float) -> dict[str, Any]:
    total = usable_gpus(cluster)
    shares = {t["name"]: t["share"] for t in teams}
    history = usage_history(jobs, shares, total, now, window,
                            {t["name"]: limit_gpus(t) for t in teams})
    by_name = {t["name"]: t for t in teams}
    rows = []
    for name in sorted(set(by_name) | set(history)):
        t = by_name.get(name, {"name": name, "share": 1.0, "quota_gpus": None,
                               "held_gpus": 0})
        s = history[name]
        quota = t.get("quota_gpus")
        borrow = t.get("borrow_gpus")
        top = max([1, total if quota is None else quota,
                   *(v for _, v in s.held), *(v for _, v in s.fair)])
        rows.append({
            "name": name, "color": team_color(name), "share": t["share"],
            "quota_gpus": quota, "held_gpus": t["held_gpus"],
            "borrow_gpus": borrow if quota is not None else None,
            "borrow": borrow_label(quota, borrow),
            "limit_gpus": limit_gpus(t),
            "borrowed_gpus": t.get("borrowed_gpus", 0), "lent_gpus": t.get("lent_gpus", 0),
            "fair_gpus": number(s.fair[-1][1]),
            "quota_pct": None if not quota else min(100, round(100 * t["held_gpus"] / quota)),
            "gpu_hours": round(gpu_hours(s.held), 2),
            "fair_gpu_hours": round(gpu_hours(s.fair), 2),
            "chart": {
                "held": polyline(s.held, now.timestamp() - window, window, top),
                "fair": polyline(s.fair, now.timestamp() - window, window, top),
                "quota_y": None if quota is None else y_of(quota, top),
                "top": top,
            },
        })
    return {"teams": rows, "usable_gpus": total, "window": duration(window),
            "window_seconds": window, "width": WIDTH, "height": HEIGHT}


def limit_gpus(team: dict) -> int | None:
    """The most GPUs a team may hold: its guarantee plus what it may borrow (none: no
    limit, for a team without a quota or with no borrowing limit)."""
    quota, borrow = team.get("quota_gpus"), team.get("borrow_gpus", 0)
    return None if quota is None or borrow is None else quota + borrow


def borrow_label(quota: int | None, borrow: int | None) -> str:
    """What a team may hold beyond its guarantee, in words."""
    if quota is None:
        return "—"            # no guarantee and no limit: all it holds is borrowed
    if borrow is None:
        return "no limit"
    return "none (hard quota)" if borrow == 0 else f"+{borrow}"


def number(x: float) -> float | int:
    """One decimal, and none for whole numbers (16, not 16.0)."""
    x = round(x, 1)
    return int(x) if x.is_integer() else x


def usable_gpus(cluster: dict) -> int:
    """GPUs that can take work: healthy, on hosts neither drained nor unreachable."""
    return sum(1 for h in cluster.get("hosts", [])
               if not h.get("drained") and h.get("reachable", True) is not False
               for g in h.get("gpus", []) if g.get("healthy", True) is not False)


def y_of(value: float, top: float) -> float:
    return round(HEIGHT - value / top * (HEIGHT - 4), 1)


def polyline(points: list[tuple[float, float]], start: float, window: float,
             top: float) -> str:
    """SVG points of a step function (a horizontal run, then a vertical jump)."""
    out: list[str] = []
    prev_y = None
    for t, v in points:
        x = round((t - start) / window * WIDTH, 1)
        y = y_of(v, top)
        if prev_y is not None and y != prev_y:
            out.append(f"{x},{prev_y}")
        out.append(f"{x},{y}")
        prev_y = y
    return " ".join(out)
