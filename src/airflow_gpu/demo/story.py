"""The story `airflow-gpu demo` tells: three waves of DAG runs (demo_dags/gpu_story.py) on
a running Airflow, watched through both APIs, then checked.

Waves start on events, not on timers, so the same things happen on every run however
slow the machine: wave 2 once the fine-tune holds its GPUs, wave 3 once the pretrain
holds a reservation. The checks read only what the APIs recorded (states, admission
times, the limit backfill cut), never wall-clock durations.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from rich.markup import escape

from ..scheduler_core.units import format_duration

TEAMS = ["nlp", "research", "vision"]
WAVES = [
    ("nlp's fine-tune: 16 GPUs on an idle cluster", ["demo_nlp_finetune"]),
    ("research's 32-GPU pretrain: more than is free", ["demo_research_pretrain"]),
    ("research's eval, vision's urgent retrain, nlp's sweep, at once",
     ["demo_research_eval", "demo_vision_retrain", "demo_nlp_sweep"]),
]
FINETUNE, PRETRAIN = "demo_nlp_finetune.finetune", "demo_research_pretrain.pretrain"
EVAL, RETRAIN = "demo_research_eval.eval", "demo_vision_retrain.retrain"
SWEEP = [f"demo_nlp_sweep.trial_{i}" for i in range(3)]
DONE = ("success", "failed")
LIVE = ("admitted", "running")


def short(job: dict) -> str:
    return f"{job['team']}/{job['name'].split('.', 1)[-1]}"


def gpus_of(job: dict) -> int:
    return sum(len(r["gpus"]) for r in job.get("replicas", []))


def brief(reason: str) -> str:
    """A pending reason without the policy's general remarks (the record keeps them)."""
    for tail in ("; it is protected once", "; smaller jobs may go first"):
        reason = reason.split(tail, 1)[0]
    return reason


class StoryFailed(RuntimeError):
    pass


class Story:
    """Triggers the waves and records what both sides say, once a `poll`."""

    def __init__(self, airflow_url: str, core_url: str, admin_token: str, say,
                 gate: Path, timeout: float = 240):
        self.af = httpx.Client(base_url=airflow_url, timeout=30)
        self.core = httpx.Client(base_url=core_url, timeout=30,
                                 headers={"Authorization": f"Bearer {admin_token}"})
        self.say, self.gate, self.timeout = say, gate, timeout
        self.t0 = time.time()
        self.jobs: dict[str, dict] = {}               # job name -> latest JobOut
        self.reasons: dict[str, list[dict]] = {}      # job name -> distinct pending reasons
        self.ti: dict[str, str] = {}                  # "dag.task" -> latest state
        self.ti_history: dict[str, list[list]] = {}   # "dag.task" -> [[t, state], ...]
        self.deferred_peak: dict[str, Any] = {"deferred": 0, "running": 0, "tasks": []}
        self.runs: dict[str, str] = {}                # dag id -> state
        self.placed: dict[str, list[dict]] = {}       # job name -> replicas while live
        self.started: set[str] = set()                # jobs whose admission was told
        self.told: dict[str, str] = {}                # job name -> last reason told
        self.waits: dict[str, list[str]] = {}         # this poll's new reasons -> jobs
        self.etas: dict[str, float | None] = {}       # and the first one's ETA

    def at(self) -> float:
        return round(time.time() - self.t0, 1)

    # -- drive ----------------------------------------------------------------------------
    def run(self) -> None:
        self._wait_for_dags()
        self.t0 = time.time()
        for n, (title, dags) in enumerate(WAVES, 1):
            self.say(f"[bold]wave {n}[/]: {title}")
            for dag_id in dags:
                r = self.af.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None})
                if r.status_code >= 300:
                    raise StoryFailed(f"triggering {dag_id} answered {r.status_code}: {r.text}")
                self.runs[dag_id] = "queued"
            if n == 1:
                self._until(lambda: self._state(FINETUNE) in LIVE,
                            "the fine-tune to be admitted")
            elif n == 2:
                self._until(lambda: bool(self._details(PRETRAIN).get("reserved_hosts")),
                            "the pretrain to get a reservation")
        self._until(self._wave_3_waits, "wave 3's GPU tasks to wait deferred")
        self.gate.touch()        # the fine-tune may end now (demo_dags/gpu_story.py)
        self._until(lambda: all(self.runs.get(d) in DONE for _, ds in WAVES for d in ds),
                    "every DAG run to end")

    def _wave_3_waits(self) -> bool:
        return self._state(EVAL) is not None and all(
            self.ti.get(t) == "deferred" for t in (PRETRAIN, RETRAIN, *SWEEP))

    def _wait_for_dags(self) -> None:
        want = {d for _, ds in WAVES for d in ds}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = self.af.get("/api/v2/dags", params={"tags": "demo", "limit": 100})
            if r.status_code == 200 and want <= {d["dag_id"] for d in r.json()["dags"]}:
                return
            time.sleep(0.5)
        raise StoryFailed(f"the dag-processor did not parse {sorted(want)} within 120 s "
                          "(see logs/dag-processor.log)")

    def _until(self, done, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            self.poll()
            if done():
                return
            failed = sorted(d for d, state in self.runs.items() if state == "failed")
            if failed:      # the story cannot go on: say so now, not at the timeout
                raise StoryFailed(f"the DAG run of {', '.join(failed)} failed while waiting "
                                  f"for {what}; task states: {self.ti} (task logs in "
                                  "logs/airflow)")
            if time.monotonic() > deadline:
                raise StoryFailed(f"waited {self.timeout:.0f} s for {what}; task states: "
                                  f"{self.ti}; jobs: " + ", ".join(
                                      f"{short(j)} {j['state']}" for j in self.jobs.values()))
            time.sleep(0.5)

    def _state(self, name: str) -> str | None:
        return (self.jobs.get(name) or {}).get("state")

    def _details(self, name: str) -> dict:
        return ((self.jobs.get(name) or {}).get("pending") or {}).get("details") or {}

    # -- watch ----------------------------------------------------------------------------
    def poll(self) -> None:
        jobs = self.core.get("/api/v1/jobs").raise_for_status().json()
        self.waits, self.etas = {}, {}
        for job in jobs:
            self._job(job)
        for text, who in self.waits.items():     # jobs of one shape wait for one reason
            code, reason = text.split(": ", 1)
            eta = self.etas.get(text)
            self.say(f"  +{self.at():5.1f}s {', '.join(who):18} [yellow]{code}[/]: "
                     f"{escape(reason)}" + (f" (ETA {format_duration(eta)})"
                                            if eta is not None else ""))
        tis = self.af.get("/api/v2/dags/~/dagRuns/~/taskInstances",
                          params={"limit": 200}).raise_for_status().json()["task_instances"]
        for ti in tis:
            self._task(f"{ti['dag_id']}.{ti['task_id']}", ti["state"] or "none")
        deferred = sorted(k for k, s in self.ti.items() if s == "deferred")
        if len(deferred) > self.deferred_peak["deferred"]:
            self.deferred_peak = {"at": self.at(), "deferred": len(deferred),
                                  "running": sum(s == "running" for s in self.ti.values()),
                                  "tasks": deferred}
        runs = self.af.get("/api/v2/dags/~/dagRuns", params={"limit": 100})
        for run in runs.raise_for_status().json()["dag_runs"]:
            self.runs[run["dag_id"]] = run["state"]

    def _job(self, job: dict) -> None:
        name, old = job["name"], self.jobs.get(job["name"])
        self.jobs[name] = job
        if job.get("replicas"):     # an ended job lists none: keep what it held
            self.placed[name] = [{"host": r["host"], "gpus": r["gpus"]}
                                 for r in job["replicas"]]
        if (old is None or old["state"] != job["state"]) and not (
                job["state"] in LIVE and name in self.started):
            self._said_job(job)
        why = job.get("pending") or {}
        if job["state"] == "pending" and why.get("code"):
            d = why.get("details") or {}
            key = [why["code"], d.get("reservation_for"), sorted(d.get("reserved_hosts") or [])]
            seen = self.reasons.setdefault(name, [])
            if not seen or seen[-1]["key"] != key:
                seen.append({"at": self.at(), "key": key, "code": why["code"],
                             "reason": self.names(why.get("reason") or ""),
                             "eta_s": why.get("eta_seconds"),
                             "reserved_hosts": d.get("reserved_hosts")})
                text = f"{why['code']}: {self.names(brief(why.get('reason') or ''))}"
                if re.sub(r"\d+", "#", text) != self.told.get(name):   # not just new numbers
                    self.told[name] = re.sub(r"\d+", "#", text)
                    self.waits.setdefault(text, []).append(short(job))
                    self.etas.setdefault(text, why.get("eta_seconds"))

    def names(self, text: str) -> str:
        """The scheduler-core names jobs by id in its reasons: say team/task instead."""
        for j in self.jobs.values():
            text = text.replace(f"'{j['id']}'", short(j)).replace(j["id"], short(j))
        return text

    def _said_job(self, job: dict) -> None:
        state = job["state"]
        if state in LIVE:         # seen first as running when it started between polls
            self.started.add(job["name"])
            hosts = sorted({r["host"] for r in job["replicas"]})
            note = ""
            if job.get("limit_cut_by"):
                cut = next((short(j) for j in self.jobs.values()
                            if j["id"] == job["limit_cut_by"]), job["limit_cut_by"])
                note = f" [magenta]backfill[/]: ahead of the reservation for {cut}"
            self.say(f"  +{self.at():5.1f}s {short(job):18} [green]admitted[/] "
                     f"{gpus_of(job)} GPUs on {', '.join(hosts)}{note}", markup=True)
        elif state in ("succeeded", "failed", "cancelled", "lost"):
            color = "green" if state == "succeeded" else "red"
            self.say(f"  +{self.at():5.1f}s {short(job):18} [{color}]{state}[/]", markup=True)

    def _task(self, key: str, state: str) -> None:
        if self.ti.get(key) == state:
            return
        self.ti[key] = state
        self.ti_history.setdefault(key, []).append([self.at(), state])
        if state == "deferred":
            job = self.jobs.get(key)
            self.say(f"  +{self.at():5.1f}s {short(job) if job else key:18} Airflow task "
                     "[cyan]deferred[/]: waits in the triggerer, holding no worker slot",
                     markup=True)

    # -- the record -----------------------------------------------------------------------
    def record(self, parallelism: int) -> dict:
        """Everything the chart and the checks need, as plain data (times: seconds from
        the first trigger)."""
        self.poll()
        cluster = self.core.get("/api/v1/cluster").raise_for_status().json()
        jobs = []
        for name, job in self.jobs.items():
            events = self.core.get(f"/api/v1/jobs/{job['id']}/explain").json().get("events", [])
            jobs.append({
                "name": name, "short": short(job), "id": job["id"], "team": job["team"],
                "priority": job["priority"], "state": job["state"],
                "gpus": sum(len(r["gpus"]) for r in self.placed.get(name, [])),
                "submitted_s": self._rel(job["submitted_at"]),
                "admitted_s": self._rel(job["admitted_at"]),
                "finished_s": self._rel(job["finished_at"]),
                "limit_cut_by": next((j["name"] for j in self.jobs.values()
                                      if j["id"] == job.get("limit_cut_by")), None),
                "replicas": self.placed.get(name, []),
                "reasons": [{k: v for k, v in r.items() if k != "key"}
                            for r in self.reasons.get(name, [])],
                "events": [{"at_s": self._rel(e["at"]), "kind": e["kind"],
                            "message": self.names(e["message"])} for e in events],
                "airflow_states": self.ti_history.get(name, []),
                "airflow_state": self.ti.get(name)})
        jobs.sort(key=lambda j: j["submitted_s"])
        return {"parallelism": parallelism, "deferred_peak": self.deferred_peak,
                "dag_runs": dict(sorted(self.runs.items())),
                "hosts": [{"name": h["name"], "gpus": len(h.get("gpus") or [])}
                          for h in cluster["hosts"]],
                "jobs": jobs}

    def _rel(self, stamp: str | None) -> float | None:
        if not stamp:
            return None
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return round(at.timestamp() - self.t0, 2)

    def close(self) -> None:
        self.af.close()
        self.core.close()


def checks(story: dict) -> dict[str, dict]:
    """What the demo promises, each {ok, says}; the test asserts the same from the JSON."""
    by = {j["name"]: j for j in story["jobs"]}
    out: dict[str, dict] = {}

    def check(name: str, ok: bool, says: str) -> None:
        out[name] = {"ok": bool(ok), "says": says}

    waited = [j for j in story["jobs"] if "deferred" in [s for _, s in j["airflow_states"]]
              and j["reasons"]]
    peak = story["deferred_peak"]
    check("deferral", peak["deferred"] > story["parallelism"] and
          {PRETRAIN, RETRAIN, *SWEEP} <= {j["name"] for j in waited},
          f"{len(waited)} GPU tasks waited deferred with a pending reason; {peak['deferred']} "
          f"at once, with {story['parallelism']} worker slots in all")
    e, p = by.get(EVAL, {}), by.get(PRETRAIN, {})
    check("backfill", e.get("limit_cut_by") is not None and _before(e, p, "admitted_s")
          and _before(p, e, "submitted_s"),
          f"{e.get('short')} started before {p.get('short')}, which was submitted first and "
          f"held a reservation; it would have yielded at the start of "
          f"{_short(by, e.get('limit_cut_by'))}'s reservation had it overrun")
    r = by.get(RETRAIN, {})
    check("priority", r.get("priority", 0) > p.get("priority", 0)
          and _before(p, r, "submitted_s") and _before(r, p, "admitted_s"),
          f"{r.get('short')} (priority {r.get('priority')}) was submitted after "
          f"{p.get('short')} (priority {p.get('priority')}) and admitted before it")
    bad = [j["short"] for j in story["jobs"]
           if j["state"] != "succeeded" or j["airflow_state"] != "success"]
    runs = story["dag_runs"]
    check("success", not bad and len(by) == 7 and runs and all(
        s == "success" for s in runs.values()),
          f"{len(by)} GPU jobs and {len(runs)} DAG runs; not succeeded: {bad or 'none'}")
    return out


def _short(by: dict, name: str | None) -> str | None:
    return by[name]["short"] if name in by else name


def _before(a: dict, b: dict, key: str) -> bool:
    return a.get(key) is not None and b.get(key) is not None and a[key] < b[key]
