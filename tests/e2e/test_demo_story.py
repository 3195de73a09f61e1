"""`airflow-gpu demo` (what `make demo` runs) end to end: real Airflow components and the
scheduler-core tell the story, and its record shows deferral, backfill and priority
order, from states and the scheduler's admission order, never from wall-clock times."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

PRETRAIN, EVAL = "demo_research_pretrain.pretrain", "demo_research_eval.eval"
RETRAIN, FINETUNE = "demo_vision_retrain.retrain", "demo_nlp_finetune.finetune"
SWEEP = [f"demo_nlp_sweep.trial_{i}" for i in range(3)]


def test_demo_tells_the_story(tmp_path):
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "demo", "--out",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "SUCCESS" in out.stdout.splitlines()[-1]
    assert "/plugin/gpu_cluster" in out.stdout          # the UI's GPU pages, while it runs
    home = re.search(r"Airflow home (\S+): migrating", out.stdout).group(1)
    assert not Path(home).parent.exists()               # its temporary files are gone
    assert (tmp_path / "demo-timeline.png").stat().st_size > 10_000
    story = json.loads((tmp_path / "demo-story.json").read_text())
    jobs = {j["name"]: j for j in story["jobs"]}
    assert len(jobs) == 7

    # every GPU job and every DAG run succeeded, on both sides
    assert {j["state"] for j in jobs.values()} == {"succeeded"}
    assert {j["airflow_state"] for j in jobs.values()} == {"success"}
    assert set(story["dag_runs"].values()) == {"success"}

    # deferral: the waiting tasks sat in the triggerer with a pending reason, more of them
    # at once than the executor has worker slots
    for name in (PRETRAIN, RETRAIN, *SWEEP):
        states = [s for _, s in jobs[name]["airflow_states"]]
        assert "deferred" in states, (name, states)
        assert jobs[name]["reasons"], name
    assert story["deferred_peak"]["deferred"] > story["parallelism"]
    sweep_codes = {r["code"] for name in SWEEP for r in jobs[name]["reasons"]}
    assert "Priority" in sweep_codes            # fits now, but on reserved resources

    # backfill: the pretrain waited with a reservation; the eval, submitted after it,
    # started before it, ahead of a reservation (it would yield there had it overrun)
    pretrain, ev = jobs[PRETRAIN], jobs[EVAL]
    assert any(r["reserved_hosts"] for r in pretrain["reasons"])
    assert pretrain["submitted_s"] < ev["submitted_s"]
    assert ev["admitted_s"] < pretrain["admitted_s"]
    assert ev["limit_cut_by"] in (PRETRAIN, RETRAIN)
    assert any("backfills ahead of the reservation" in e["message"] for e in ev["events"])

    # priority: vision's retrain (priority 50) came after research's pretrain (0) and
    # went first; nlp's sweep went last
    retrain = jobs[RETRAIN]
    assert retrain["priority"] > pretrain["priority"]
    assert pretrain["submitted_s"] < retrain["submitted_s"]
    assert retrain["admitted_s"] < pretrain["admitted_s"]
    assert all(jobs[t]["admitted_s"] >= pretrain["finished_s"] for t in SWEEP)

    # the timeline: which GPUs each job held (the whole cluster for the pretrain)
    assert pretrain["gpus"] == 32 and retrain["gpus"] == 24 and ev["gpus"] == 2
    assert {r["host"] for r in pretrain["replicas"]} == {h["name"] for h in story["hosts"]}
    assert all(c["ok"] for c in story["checks"].values()), story["checks"]
    assert "Timeline" in out.stdout and "dgx-a-02" in out.stdout


def _record(**admitted: float) -> dict:
    """A small record as Story.record writes it: the demo's seven jobs, every one deferred
    with a reason but the fine-tune and the eval, admitted at the given seconds."""
    times = {FINETUNE: (0, 1, 20), PRETRAIN: (2, 30, 40), EVAL: (5, 6, 9),
             RETRAIN: (6, 21, 29), **{t: (7, 41, 45) for t in SWEEP}}
    jobs = []
    for name, (sub, adm, fin) in times.items():
        adm = admitted.get(name.split(".")[1], adm)
        jobs.append({"name": name, "short": name, "state": "succeeded",
                     "airflow_state": "success", "priority": 50 if name == RETRAIN else 0,
                     "submitted_s": sub, "admitted_s": adm, "finished_s": fin,
                     "gpus": 8, "replicas": [{"host": "dgx-h-01", "gpus": list(range(8))}],
                     "limit_cut_by": PRETRAIN if name == EVAL else None,
                     "reasons": [] if name in (FINETUNE, EVAL) else [{"code": "Resources"}],
                     "airflow_states": [[0, "running"], [1, "deferred"], [9, "success"]]})
    return {"parallelism": 4, "deferred_peak": {"deferred": 5}, "jobs": jobs,
            "dag_runs": {"a": "success"}, "hosts": [{"name": "dgx-h-01", "gpus": 8}]}


def test_the_checks_fail_when_the_story_does_not_happen(tmp_path):
    from rich.console import Console

    from airflow_gpu.demo.story import checks
    from airflow_gpu.demo.timeline import terminal_chart, write_png

    assert all(c["ok"] for c in checks(_record()).values())
    assert not checks(_record(eval=31))["backfill"]["ok"]      # the eval waited its turn
    assert not checks(_record(retrain=35))["priority"]["ok"]   # priority 50 came second
    late = _record()
    late["deferred_peak"]["deferred"] = 4                      # no more than the slots
    assert not checks(late)["deferral"]["ok"]
    failed = _record()
    failed["jobs"][0]["state"] = "failed"
    assert not checks(failed)["success"]["ok"]
    console = Console(record=True, width=120)
    console.print(terminal_chart(_record()))
    assert "dgx-h-01" in console.export_text()
    assert write_png(_record(), tmp_path / "t.png").stat().st_size > 1000
