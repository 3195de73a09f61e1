"""PNG plots of replays: wait-time CDF per policy, GPU utilization and queue length over time.

Needs matplotlib (`pip install 'airflow-provider-gpu[plot]'`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .metrics import SimResult

DAY = 86400.0


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'airflow-provider-gpu[plot]'") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _binned(r: SimResult, values, bins: int = 400) -> tuple[list[float], list[float]]:
    """Time-weighted mean of a step series (value holds until the next sample) per bin."""
    if len(r.times) < 2:
        return list(r.times), [float(v) for v in values]
    t0, t1 = r.times[0], r.times[-1]
    width = (t1 - t0) / bins or 1.0
    sums = [0.0] * bins
    for k in range(len(r.times) - 1):
        a, b, v = r.times[k], r.times[k + 1], values[k]
        i = min(int((a - t0) / width), bins - 1)
        while a < b:
            edge = b if i >= bins - 1 else min(b, t0 + (i + 1) * width)
            sums[i] += v * max(0.0, edge - a)
            a, i = edge, i + 1
    xs = [(t0 + (i + 0.5) * width) / DAY for i in range(bins)]
    return xs, [s / width for s in sums]


def write_plots(results: list[SimResult], out_dir: str | Path, title: str = "") -> list[Path]:
    """wait_cdf.png, utilization.png and queue_length.png in `out_dir`; returns the paths."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        waits = sorted(rec.start - rec.submit for rec in r.records if rec.start is not None)
        if waits:
            ys = [(i + 1) / len(waits) for i in range(len(waits))]
            ax.plot([max(w, 1.0) for w in waits], ys, label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("wait time (s, log; 0 shown as 1)")
    ax.set_ylabel("share of jobs")
    ax.set_title(f"Wait time CDF {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(_save(fig, out / "wait_cdf.png", plt))

    for name, series, label in (
            ("utilization.png", lambda r: [b / r.total_gpus for b in r.busy], "GPUs busy (share)"),
            ("queue_length.png", lambda r: r.queued, "jobs waiting")):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for r in results:
            xs, ys = _binned(r, series(r))
            ax.plot(xs, ys, label=r.policy, linewidth=1)
        ax.set_xlabel("time (days)")
        ax.set_ylabel(label)
        ax.set_title(f"{label} {title}".strip())
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(_save(fig, out / name, plt))
    return paths


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
