"""The demo's timeline, from its record (story.Story.record): which job waited when,
and which held which GPUs when, as a terminal chart (rich) and a PNG (matplotlib, the
`plot` extra)."""

from __future__ import annotations

import string
from pathlib import Path

from rich.console import Group
from rich.text import Text

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#17becf", "#bcbd22", "#7f7f7f"]
WIDTH = 60          # columns of the terminal chart
LABEL = 20          # width of its labels


def _end(story: dict) -> float:
    times = [t for j in story["jobs"] for t in (j["finished_s"], j["admitted_s"],
                                                   j["submitted_s"]) if t is not None]
    return max(times, default=1.0) or 1.0


def _letters(story: dict) -> dict[str, tuple[str, str]]:
    """job name -> (letter, color), in submit order."""
    return {j["name"]: (string.ascii_uppercase[i % 26], COLORS[i % len(COLORS)])
            for i, j in enumerate(story["jobs"])}


def terminal_chart(story: dict) -> Group:
    """One lane per job (░ waiting, █ holding its GPUs), then one per host (the letter of
    the job holding most of its GPUs: upper case all of them, lower case some)."""
    end, marks = _end(story), _letters(story)
    step = end / WIDTH
    lines = [Text(f"Timeline: seconds since the first DAG run was triggered (one column = "
                  f"{step:.1f} s); ░ waiting, █ holding GPUs", style="bold"),
             Text(" " * LABEL + _axis(end), style="dim")]
    for j in story["jobs"]:
        letter, color = marks[j["name"]]
        line = Text(f"{letter} {j['short']}"[:LABEL - 1].ljust(LABEL), style=color)
        for c in range(WIDTH):
            t = (c + 0.5) * step
            if _within(t, j["admitted_s"], j["finished_s"], end):
                line.append("█", style=color)
            elif _within(t, j["submitted_s"], j["admitted_s"], end):
                line.append("░", style=color)
            else:
                line.append(" ")
        line.append(f" {j['gpus']:>2} GPUs, priority {j['priority']}"
                    + (", backfill" if j.get("limit_cut_by") else ""))
        lines.append(line)
    lines.append(Text(""))
    for h in story["hosts"]:
        line = Text(h["name"][:LABEL - 1].ljust(LABEL))
        for c in range(WIDTH):
            t = (c + 0.5) * step
            held = {j["name"]: sum(len(r["gpus"]) for r in j["replicas"]
                                   if r["host"] == h["name"]) for j in story["jobs"]
                    if _within(t, j["admitted_s"], j["finished_s"], end)}
            held = {k: v for k, v in held.items() if v}
            if not held:
                line.append("·", style="dim")
                continue
            name = max(held, key=held.get)
            letter, color = marks[name]
            line.append(letter if held[name] >= h["gpus"] else letter.lower(), style=color)
        line.append(f" {h['gpus']} GPUs")
        lines.append(line)
    return Group(*lines)


def _axis(end: float) -> str:
    marks = [" "] * WIDTH
    for c in range(0, WIDTH, 15):
        label = f"{c * end / WIDTH:.0f}s"
        marks[c:c + len(label)] = label
    return "".join(marks[:WIDTH])


def _within(t: float, start: float | None, stop: float | None, end: float) -> bool:
    return start is not None and start <= t < (stop if stop is not None else end)


def write_png(story: dict, path: Path) -> Path | None:
    """Jobs (hatched: waiting; solid: holding GPUs) above, every GPU of the cluster below.
    None when matplotlib (the `plot` extra) is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return None
    end, marks = _end(story), _letters(story)
    jobs, hosts = story["jobs"], story["hosts"]
    rows = [(h["name"], g) for h in hosts for g in range(h["gpus"])]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 3 + 0.42 * len(jobs) + 0.16 * len(rows)), sharex=True,
        gridspec_kw={"height_ratios": [len(jobs) + 1, 0.45 * len(rows) + 1]})
    for y, j in enumerate(reversed(jobs)):
        letter, color = marks[j["name"]]
        if j["submitted_s"] is not None:
            wait_end = j["admitted_s"] if j["admitted_s"] is not None else end
            top.broken_barh([(j["submitted_s"], wait_end - j["submitted_s"])], (y - 0.3, 0.6),
                            facecolors="white", edgecolors=color, hatch="///", linewidth=1)
        if j["admitted_s"] is not None:
            stop = j["finished_s"] if j["finished_s"] is not None else end
            top.broken_barh([(j["admitted_s"], stop - j["admitted_s"])], (y - 0.3, 0.6),
                            facecolors=color)
            note = f" {j['gpus']} GPUs" + (" (backfill)" if j.get("limit_cut_by") else "")
            top.text(stop, y, note, va="center", fontsize=8)
    top.set_yticks(range(len(jobs)))
    top.set_yticklabels([f"{marks[j['name']][0]} {j['short']} (p{j['priority']})"
                         for j in reversed(jobs)], fontsize=8)
    top.set_title("Jobs: waiting (hatched: deferred in Airflow, no worker slot) and "
                  "holding GPUs (solid)", fontsize=10, loc="left")
    top.legend(handles=[Patch(facecolor="white", edgecolor="gray", hatch="///",
                              label="waiting"), Patch(facecolor="gray", label="holding GPUs")],
               loc="upper right", fontsize=8)
    index = {row: i for i, row in enumerate(reversed(rows))}
    for j in jobs:
        if j["admitted_s"] is None:
            continue
        stop = j["finished_s"] if j["finished_s"] is not None else end
        for r in j["replicas"]:
            for g in r["gpus"]:
                y = index[(r["host"], g)]
                bottom.broken_barh([(j["admitted_s"], stop - j["admitted_s"])],
                                   (y - 0.45, 0.9), facecolors=marks[j["name"]][1],
                                   edgecolors="white", linewidth=0.3)
    for i in range(1, len(hosts)):          # a line between hosts
        bottom.axhline(len(rows) - sum(x["gpus"] for x in hosts[:i]) - 0.5, color="black",
                       linewidth=0.6)
    bottom.set_yticks([index[(h["name"], 0)] - (h["gpus"] - 1) / 2 for h in hosts])
    bottom.set_yticklabels([f"{h['name']}\n{h['gpus']} GPUs" for h in hosts], fontsize=8)
    bottom.set_ylim(-0.6, len(rows) - 0.4)
    bottom.set_title("GPUs: which job held which GPU when", fontsize=10, loc="left")
    bottom.set_xlabel("seconds since the first DAG run was triggered")
    bottom.set_xlim(0, end * 1.08)
    bottom.legend(handles=[Patch(facecolor=marks[j["name"]][1],
                                 label=f"{marks[j['name']][0]} {j['short']}") for j in jobs],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
