"""Reclaim x guarantees x gangs through the real service and its store (SQLite and
PostgreSQL): nlp (guarantee 24, borrows freely) runs two 16-GPU gangs, one of them half
borrowed, and a small borrowed job; vision (guarantee 16) reclaims. The reclaim keeps nlp
at its guarantee while a set of victims allows it; when only the half-borrowed gang frees
room it stops it and says so in the events, the reasons, `queue` and `explain`. A job that
will reclaim once its victim has run min_run_time says so, with that ETA."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from sqlalchemy import update

from airflow_gpu.cli.commands.jobs_command import _explain_table
from airflow_gpu.cli.commands.slurm_command import queue_table
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.databases import serve
from tests.scheduler_core.api.test_api import auth, spec, submit

POLICY = {"teams": {"nlp": {"quota_gpus": 24, "borrow_gpus": None},
                    "vision": {"quota_gpus": 16, "borrow_gpus": None}},
          "preemption": {"min_run_time": "10m", "min_saved_wait": 0}}
FIVE_HOSTS = ({"name": "dgx-[1-5]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


@pytest.fixture
def api(db_url):
    yield from serve(db_url, PolicyConfig.model_validate(POLICY), FIVE_HOSTS)


def get(api, path: str, team: str = "nlp"):
    r = api.get(path, headers=auth(api, team))
    assert r.status_code == 200, r.text
    return r.json()


def job(api, j: dict) -> dict:
    return get(api, f"/api/v1/jobs/{j['id']}")


def ids(text: str, *jobs: dict) -> str:
    """`text` with jobs named by id, where the API names them "name (short id)"."""
    for j in jobs:
        text = text.replace(f"{j['name']} ({j['id'][:8]})", j["id"])
    return text


def events(api, j: dict) -> list[dict]:
    return get(api, f"/api/v1/jobs/{j['id']}/explain")["events"]


def shown(table) -> str:
    """The table as the CLI prints it, its words joined again where a cell wraps."""
    out = io.StringIO()
    Console(file=out, width=2000).print(table)
    return " ".join(out.getvalue().split())


def started(api, team: str, name: str, gpus: int, ago: timedelta, runtime="12h") -> dict:
    """A job admitted now, its admission moved `ago` into the past (how long it ran)."""
    j = submit(api, team, spec(name, gpus, runtime=runtime)).json()
    assert api.tick() == [j["id"]], job(api, j)
    with api.service.sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == j["id"]).values(
            admitted_at=datetime.now(UTC) - ago))
    return job(api, j)


def stopped(api, j: dict) -> None:
    """Its launcher confirms the stop."""
    r = api.post(f"/api/v1/jobs/{j['id']}/finish",
                 json={"outcome": "preempted", "attempt": j["attempt"]},
                 headers=auth(api, j["team"]))
    assert r.status_code == 200, r.text


def nlp_over(api, b_ran: timedelta) -> tuple[dict, dict, dict, dict]:
    """nlp: a (16, guaranteed), b (16, 8 of them borrowed), c (4, borrowed) = 36 GPUs;
    vision: v0 (4). Five 8-GPU hosts: all full."""
    a = started(api, "nlp", "a", 16, timedelta(hours=3))
    b = started(api, "nlp", "b", 16, b_ran)
    c = started(api, "nlp", "c", 4, timedelta(hours=2))
    v0 = started(api, "vision", "v0", 4, timedelta(hours=1))
    assert [x["borrowed"] for x in (a, b, c, v0)] == [False, True, True, False]
    return a, b, c, v0


def test_reclaim_keeps_nlp_at_its_guarantee_then_says_when_a_gang_breaks_it(api):
    a, b, c, v0 = nlp_over(api, timedelta(minutes=20))
    # b loses less work than c (16 GPUs x 20m against 4 x 2h), but stopping it would
    # leave nlp at 20 of its 24: c goes
    v1 = submit(api, "vision", spec("v1", 4)).json()
    assert api.tick() == []
    assert (job(api, b)["state"], job(api, c)["state"]) == ("admitted", "preempting")
    assert "guarantee broken" not in job(api, c)["preempt_reason"]
    stopped(api, job(api, c))
    assert api.tick() == [v1["id"]]

    # 8 GPUs on one host: only b frees them, and nlp (a and b: 32) keeps 16 of its 24
    v2 = submit(api, "vision", spec("v2", 8)).json()
    assert api.tick() == []
    b = job(api, b)
    assert b["state"] == "preempting" and b["preempted_by"] == v2["id"]
    broken = (f"guarantee broken: team 'nlp' keeps 16 GPUs of its quota_gpus 24, for job "
              f"{v2['id']} of team 'vision': a gang stops whole, and every set of borrowed "
              "jobs that frees room for it takes some team below its guarantee")
    assert broken + ", and what is left is too little for this job to restart on (16 GPUs)" \
        in ids(b["preempt_reason"], v2)
    assert [e["message"] for e in events(api, b) if e["kind"] == "preempted"] == [
        b["preempt_reason"]]
    why = job(api, v2)["pending"]
    assert why["code"] == "Preempting" and broken in ids(why["reason"], v2)
    assert why["details"]["guarantee_broken"] == ["nlp"]
    assert api.tick() == []                 # and so it stays while b stops
    why = job(api, v2)["pending"]
    assert why["code"] == "Preempting" and broken in ids(why["reason"], v2)
    (said,) = [e["message"] for e in events(api, v2) if e["kind"] == "preempting"]
    assert ids(said, v2).endswith(broken)

    # b stops; v2 starts on half of its GPUs, c (4) on what is left, as nlp's guarantee
    # now covers it; b waits, saying why
    stopped(api, b)
    assert sorted(api.tick()) == sorted([v2["id"], c["id"]])
    assert not job(api, c)["borrowed"]
    b = job(api, b)
    assert b["state"] == "pending" and b["requeue_reason"] == "preempted"
    assert ids(b["pending"]["reason"], v2).endswith(
        f"; preempted by job {v2['id']}, {broken}, and what is left is too little for "
        "this job to restart on (16 GPUs)")
    assert b["pending"]["details"]["guarantee_broken_by"] == v2["id"]
    explained = shown(_explain_table(get(api, f"/api/v1/jobs/{b['id']}/explain")))
    # (explain may name jobs by name and short id)
    assert re.search(r"; preempted by job [^,;]+, guarantee broken: team 'nlp' keeps 16 GPUs "
                     r"of its quota_gpus 24, for job [^;]+ too little for this job to "
                     r"restart on \(16 GPUs\) ┏", explained), explained
    assert "preempted 1 time(s); last: preempted by job" in explained
    queue = shown(queue_table(get(api, "/api/v1/queue")))
    row = queue[queue.index(f"{b['id'][:8]} │ b │ nlp │ pending"):]
    assert row.index("guarantee broken: team 'nlp' keeps 16 GPUs") < row.index(
        "requeued: preempted)")


def test_a_job_that_will_reclaim_says_which_job_and_when(api):
    _, b, _, _ = nlp_over(api, timedelta(minutes=5))
    v1 = submit(api, "vision", spec("v1", 8)).json()
    assert api.tick() == []
    why = job(api, v1)["pending"]
    assert why["code"] == "Resources"
    assert ids(why["reason"], b).startswith(
        f"will preempt {b['id']} (reclaim) once it has run min_run_time (10m), and start "
        "when it has stopped; until then: ")
    assert why["details"]["will_preempt"] == [b["id"]]
    # the ETA: b may be stopped 10m after its admission, then it has its grace (30s)
    admitted = datetime.fromisoformat(b["admitted_at"]).replace(tzinfo=UTC)
    assert abs(why["eta_seconds"] - (admitted + timedelta(minutes=10, seconds=30)
                                     - datetime.now(UTC)).total_seconds()) < 5
    queue = shown(queue_table(get(api, "/api/v1/queue")))
    row = queue[queue.index(f"{v1['id'][:8]} │ v1 │ vision │ pending"):]
    assert row.index(" 5m") < row.index("Resources: will preempt")


def test_a_quota_wait_has_an_eta(db_url):
    hard = {"teams": {"vision": {"quota_gpus": 8}}}
    for api in serve(db_url, PolicyConfig.model_validate(hard), FIVE_HOSTS):
        v0 = submit(api, "vision", spec("v0", 8, runtime="2h")).json()
        assert api.tick() == [v0["id"]]
        v1 = submit(api, "vision", spec("v1", 8)).json()
        api.tick()
        why = job(api, v1)["pending"]
        assert why["code"] == "Quota" and why["reason"].endswith(
            f"; enough of it is expected back when job v0 ({v0['id'][:8]}) ends")
        assert why["details"]["quota_frees_with"] == v0["id"]     # the details keep the id
        assert 7100 < why["eta_seconds"] <= 7200
