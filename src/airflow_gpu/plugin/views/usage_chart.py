"""A job's GPU utilization (and power) over time, from the service's usage series, as the
geometry of a small inline SVG chart that job.html draws: on the server, like the teams
page's charts (no chart library, no CDN, nothing loaded from another origin)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from statistics import median
from typing import Any

from ..format import duration, parse_time
from .teams import number

WIDTH, HEIGHT = 640, 160            # chart size in SVG units
LEFT, RIGHT, TOP, BOTTOM = 36, 46, 8, 18   # margins that hold the axis labels
GAP_STEPS = 5       # a pause over this many typical sample steps breaks the line
UTIL_TICKS = (0, 50, 100)


def usage_chart(series: list[dict], power: bool = True) -> dict[str, Any]:
    """Points of the utilization line (0-100 % axis) and, when `power` and the series has
    any, of the power line (its own axis, 0 to a round maximum, on the right); time runs
    from the first sample to the last. `empty` when there is no sample (e.g. hosts
    declared without a node agent)."""
    frame = {"width": WIDTH, "height": HEIGHT, "x0": LEFT, "x1": WIDTH - RIGHT,
             "y0": TOP, "y1": HEIGHT - BOTTOM}
    samples = [(t.timestamp(), p) for p in series
               if (t := parse_time(p.get("at"))) is not None]
    samples.sort(key=lambda s: s[0])
    if not samples:
        return {"empty": True, "samples": 0, **frame}
    t0, t1 = samples[0][0], samples[-1][0]
    span = t1 - t0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return round(LEFT + ((t - t0) / span if span else 1.0) * plot_w, 1)

    def y(value: float, top: float) -> float:
        return round(TOP + plot_h - min(max(value, 0.0), top) / top * plot_h, 1)

    util = _lines([(t, p.get("utilization_gpu")) for t, p in samples], x,
                  lambda v: y(v, 100.0))
    watts = [p.get("power_watts") for _, p in samples if p.get("power_watts") is not None]
    top = nice_ceiling(max(watts)) if power and watts else None
    power_lines = None if top is None else _lines(
        [(t, p.get("power_watts")) for t, p in samples], x, lambda v: y(v, top))
    start, end = (datetime.fromtimestamp(t, UTC) for t in (t0, t1))
    return {
        "empty": False, "samples": len(samples), **frame,
        "util": util["lines"], "util_dots": util["dots"],
        "power": None if power_lines is None else power_lines["lines"],
        "power_dots": [] if power_lines is None else power_lines["dots"],
        "power_top": None if top is None else watts_label(top),
        "grid": [{"y": y(v, 100.0), "label": f"{v} %"} for v in UTIL_TICKS],
        "start": time_label(start, None, span), "end": time_label(end, start, span),
        "span": duration(span),
    }


def _lines(points: list[tuple[float, float | None]], x, y) -> dict[str, list]:
    """SVG polylines' points ("x,y x,y ..."): one point per sample with a value, a new
    line after a sample without one or a pause in the samples (GAP_STEPS typical steps);
    a lone point becomes a dot (a polyline of one point draws nothing)."""
    steps = [b[0] - a[0] for a, b in zip(points, points[1:], strict=False) if b[0] > a[0]]
    gap = GAP_STEPS * median(steps) if steps else math.inf
    runs: list[list[tuple[float, float]]] = [[]]
    prev_t = None
    for t, v in points:
        if runs[-1] and (v is None or (prev_t is not None and t - prev_t > gap)):
            runs.append([])
        if v is not None:
            runs[-1].append((x(t), y(v)))
        prev_t = t
    runs = [r for r in runs if r]
    return {"lines": [" ".join(f"{px},{py}" for px, py in r) for r in runs if len(r) > 1],
            "dots": [{"x": r[0][0], "y": r[0][1]} for r in runs if len(r) == 1]}


def nice_ceiling(value: float) -> float:
    """The next 1, 2, 2.5 or 5 x 10^n at or above `value` (an axis' top)."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return float(next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= value))


def watts_label(w: float) -> str:
    return f"{number(w / 1000)} kW" if w >= 1000 else f"{number(float(w))} W"


def time_label(t: datetime, start: datetime | None, span: float) -> str:
    """UTC time on the chart's axis; the date only where it differs from the start's."""
    fmt = "%H:%M:%S" if span < 600 else "%H:%M"
    if start is None or t.date() != start.date():
        fmt = "%Y-%m-%d " + fmt
    return t.strftime(fmt)
