"""What the planner should plan with when runtimes are wrong, measured on the shared traces.

Run it directly (about 3 minutes on two cores):

    .venv/bin/python bench/estimates.py [--only itp-cluster02,...] [--jobs 2]
                                        [--out bench/results/estimates]

1. The correction's curve: `correct_estimates` (off, up, both) x `estimate_quantile`
   (0.5, 0.8, 0.9) under three estimate modes (lognormal 0.2 and 0.5: the operators'
   median of a task's last runs; limit:1.5-10: Slurm users' limits, no estimate). Per
   mode, the sums over the traces of average, p95 and max wait, and the overrun stops.
2. A team that under-declares: each trace's jobs split in two teams by job id; `liars`
   declare a quarter of their runtime, `honest` the runtime. Each team's average wait
   with both teams honest (the control), and with the liars lying, uncorrected and under
   the default policy (corrected), with the liars' overrun stops.

Each trace runs on the cluster bench/replay.py sizes for it (offered load 80-100 %).
Philly is left out by default: one replay takes a minute, and the ITP traces already
span 16 to 200 GPUs. Writes `estimates.json` and `estimates.md` under `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import zlib
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay  # noqa: E402  (the trace set-ups: one place)
from airflow_gpu.scheduler_core.engine.cluster import synthetic_cluster  # noqa: E402
from airflow_gpu.scheduler_core.policy.config import PolicyConfig  # noqa: E402
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate  # noqa: E402

TRACES = [n for n in replay.SETUPS if n != "philly"]
MODES = ("lognormal:0.2", "lognormal:0.5", "limit:1.5-10")
VARIANTS = {"off": {"correct_estimates": "off"},
            **{f"{m} q{q}": {"correct_estimates": m, "estimate_quantile": q}
               for m in ("up", "both") for q in (0.5, 0.8, 0.9)}}
DEFAULT = f"up q{PolicyConfig().estimate_quantile}"
SLOWDOWN = (1.0, 1.1, 1.3)
LIE = 4.0


def replay_one(task: tuple) -> dict:
    name, mode, label, fields, lie = task
    trace = replay.load(name, replay.TRACES, None, mode)
    if lie is not None:          # two teams by job id; the liars declare 1/lie
        trace = [dataclasses.replace(
            t, team="liars" if zlib.crc32(t.job_id.encode()) % 2 == 0 else "honest",
            expected_runtime=t.duration / lie if zlib.crc32(t.job_id.encode()) % 2 == 0
            else t.duration) for t in trace]
    res = simulate(synthetic_cluster(replay.SETUPS[name][0], "dgx-a100"), trace,
                   SimOptions(PolicyConfig(locality_slowdown=SLOWDOWN, **fields), SLOWDOWN))
    m = res.metrics()
    out = {"trace": name, "mode": mode, "label": label, "lie": lie,
           **{k: m[k] for k in ("avg_wait_s", "p95_wait_s", "max_wait_s", "avg_jct_s",
                                "overrun_stops", "timeouts", "lost_fraction")}}
    for team in ("liars", "honest"):
        rs = [r for r in res.records if r.team == team and r.start is not None]
        if rs:
            out[team] = {"avg_wait_s": mean(r.start - r.submit for r in rs),
                         "overrun_stops": sum(r.overrun_stops for r in rs)}
    return out


def h(seconds: float) -> str:
    return f"{seconds / 3600:,.1f}"


def markdown(runs: list[dict], names: list[str]) -> str:
    lines = ["Sums over " + ", ".join(names) + " (hours; stops: overrun stops):", "",
             "| estimates | variant | avg wait | p95 wait | max wait | stops | timeouts |",
             "|---|---|---|---|---|---|---|"]
    curve = [r for r in runs if r["lie"] is None]
    for mode in MODES:
        for label in VARIANTS:
            rs = [r for r in curve if (r["mode"], r["label"]) == (mode, label)]
            mark = " (default)" if label == DEFAULT else ""
            lines.append(f"| {mode} | {label}{mark} | "
                         + " | ".join(h(sum(r[k] for r in rs)) for k in
                                      ("avg_wait_s", "p95_wait_s", "max_wait_s"))
                         + f" | {sum(r['overrun_stops'] for r in rs)} | "
                         f"{sum(r['timeouts'] for r in rs)} |")
    lines += ["", f"A team that declares 1/{LIE:g} of its runtime (average wait, hours; the "
              "control: both teams honest):", "",
              "| trace | liars: control | liars: uncorrected | liars: default | "
              "honest: control | honest: uncorrected | honest: default | liars' stops "
              "uncorrected / default |", "|---|---|---|---|---|---|---|---|"]
    teams = {(r["trace"], r["label"], r["lie"]): r for r in runs if r["lie"] is not None}
    for name in names:
        ctl, off, on = (teams[(name, "control", 1.0)], teams[(name, "off", LIE)],
                        teams[(name, DEFAULT, LIE)])
        lines.append(f"| {name} | " + " | ".join(
            h(x[t]["avg_wait_s"]) for t in ("liars", "honest") for x in (ctl, off, on))
            + f" | {off['liars']['overrun_stops']} / {on['liars']['overrun_stops']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(TRACES), help="comma-separated trace names")
    ap.add_argument("--jobs", type=int, default=1, help="replays run at once (processes)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results"
                    / "estimates")
    args = ap.parse_args()
    names = args.only.split(",")
    unknown = [n for n in names if n not in replay.SETUPS]
    if unknown:
        ap.error(f"--only: unknown trace {unknown[0]!r}; known: {', '.join(replay.SETUPS)}")
    tasks = [(n, m, label, fields, None) for n in names for m in MODES
             for label, fields in VARIANTS.items()]
    tasks += [(n, "exact", "control", VARIANTS[DEFAULT], 1.0) for n in names]
    tasks += [(n, "exact", label, VARIANTS[label], LIE) for n in names
              for label in ("off", DEFAULT)]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = list(pool.map(replay_one, tasks))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "estimates.json").write_text(json.dumps(
        {"benchmark": "estimates", "when": datetime.now(UTC).isoformat(timespec="seconds"),
         "traces": names, "runs": runs}, indent=2))
    text = markdown(runs, names)
    (args.out / "estimates.md").write_text(text)
    print(text)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
