"""The page models and templates without a server: what the scheduler's JSON becomes,
including parts the demo stack cannot produce (unreachable hosts, utilization)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from airflow_gpu.plugin.app import create_app
from airflow_gpu.plugin.auth import require_login
from airflow_gpu.plugin.source import SourceError
from airflow_gpu.plugin.views.cluster import cluster_page, nvlink_label
from airflow_gpu.plugin.views.job import job_page, task_instance, task_instance_url
from airflow_gpu.plugin.views.queue import queue_page
from airflow_gpu.plugin.views.teams import borrow_label, limit_gpus, polyline, teams_page
from airflow_gpu.plugin.views.usage_history import fair_shares, gpu_hours, usage_history

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def at(minutes_ago: float) -> str:
    return (NOW - timedelta(minutes=minutes_ago)).isoformat()


def gpu(index: int, numa: int, job: str | None = None, team: str | None = None,
        healthy: bool = True, **extra) -> dict:
    return {"index": index, "name": "NVIDIA A100", "numa_node": numa, "healthy": healthy,
            "health_reason": None if healthy else "XID 79", "job": job, "team": team,
            **extra}


def host(name: str, rack: str, switch: str, gpus: list[dict], **extra) -> dict:
    return {"name": name, "model": "dgx-1v", "rack": rack, "switch": switch,
            "drained": False, "nvlink": {"fabric": "direct", "groups": [[0, 1], [2, 3]]},
            "gpus": gpus, **extra}


CLUSTER = {"cluster": "c", "hosts": [
    host("a", "r1", "s1", [gpu(0, 0, "j1", "vision", utilization_gpu=87.4,
                               utilization_memory=40.0, power_watts=250.0),
                           gpu(1, 0, "j1", "vision"), gpu(2, 1), gpu(3, 1, healthy=False)]),
    host("b", "r1", "s2", [gpu(0, 0), gpu(1, 0), gpu(2, 1), gpu(3, 1)], reachable=False),
    host("c", "r2", "s3", [gpu(0, 0), gpu(1, 0), gpu(2, 1), gpu(3, 1)], drained=True),
]}
LIVE = [{"id": "j1", "name": "train", "team": "vision", "state": "running", "priority": 0,
         "spec": {"roles": [{"name": "w", "gpus": 2}], "expected_runtime": "1h"},
         "submitted_at": at(30), "admitted_at": at(20), "started_at": at(20),
         "finished_at": None, "replicas": [{"role": "w", "index": 0, "host": "a",
                                             "gpus": [0, 1], "cpus": [0, 1, 2, 3],
                                             "memory_by_numa": {"0": 2**30},
                                             "nics": ["mlx5_0"], "live": True}]}]


def pending(name: str, priority: int, minutes_ago: float, **why) -> dict:
    return {"id": f"id-{name}", "name": name, "team": "nlp", "state": "pending",
            "priority": priority, "spec": {"roles": [{"name": "w", "gpus": 4}]},
            "submitted_at": at(minutes_ago), "admitted_at": None, "started_at": None,
            "finished_at": None, "replicas": [],
            "pending": {"code": "Resources", "reason": "held by j1 (2)",
                        "details": {"held_by": {"j1": 2}}, "eta_seconds": 600, **why}}


def test_cluster_groups_racks_switches_hosts_and_numa_nodes():
    page = cluster_page(CLUSTER, LIVE)
    assert [r["name"] for r in page["racks"]] == ["r1", "r2"]
    assert [s["name"] for s in page["racks"][0]["switches"]] == ["s1", "s2"]
    a, b = (s["hosts"][0] for s in page["racks"][0]["switches"])
    assert [n["node"] for n in a["numa"]] == [0, 1]
    g0 = a["numa"][0]["gpus"][0]
    assert (g0["job_name"], g0["team"], g0["nvlink_group"]) == ("train", "vision", "A")
    assert a["numa"][1]["gpus"][0]["nvlink_group"] == "B"
    assert a["status"] == "degraded" and b["status"] == "unreachable"
    assert page["racks"][1]["switches"][0]["hosts"][0]["status"] == "drained"
    assert page["summary"] == {"hosts": 3, "gpus_total": 12, "gpus_held": 2, "gpus_free": 1,
                               "gpus_unhealthy": 1, "hosts_drained": 1,
                               "hosts_unreachable": 1}
    assert page["teams"][0]["name"] == "vision"


def test_nvlink_labels():
    assert nvlink_label({"fabric": "nvswitch", "groups": [list(range(8))]}, 8)["text"] == \
        "NVLink (nvswitch): all 8 GPUs in one group"
    assert nvlink_label({"fabric": "direct", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]},
                        8)["text"] == "NVLink (direct) groups A: GPU 0-3, B: GPU 4-7"
    assert nvlink_label({"fabric": "none", "groups": [[0], [1]]}, 2)["text"] == \
        "no NVLink between GPUs"
    assert nvlink_label(None, 2)["text"] == "NVLink: not reported"


def test_queue_orders_by_priority_then_age_and_names_blockers():
    page = queue_page([pending("low", 0, 50), pending("high", 9, 1), pending("old", 9, 5)],
                      LIVE, NOW)
    assert [p["name"] for p in page["pending"]] == ["old", "high", "low"]
    first = page["pending"][0]
    assert first["reason"] == "held by train (2)"
    assert first["blockers"] == [{"id": "j1", "name": "train", "gpus": 2}]
    assert first["eta"] == "in 10m" and first["waiting"] == "5m"
    (live,) = page["live"]
    assert live["placement"] == [{"host": "a", "gpus": "GPU 0-1"}]
    assert (live["elapsed"], live["expected"], live["progress"]) == ("20m", "1h", 33)


@pytest.mark.parametrize(("key", "expected"), [
    ("dag/task/manual__2025-01-01T00:00:00+00:00/-1/1",
     {"dag_id": "dag", "task_id": "task", "run_id": "manual__2025-01-01T00:00:00+00:00",
      "map_index": -1, "try_number": 1}),
    ("d/g.t/run/with/slashes/3/2",
     {"dag_id": "d", "task_id": "g.t", "run_id": "run/with/slashes", "map_index": 3,
      "try_number": 2}),
    ("x" * 150 + "#" + "f" * 32, None),        # a long key, shortened with a hash
    ("my-own-key", None),                       # not submitted by Airflow
    (None, None),
])
def test_task_instance_from_the_idempotency_key(key, expected):
    assert task_instance(key) == expected


def test_task_instance_url_quotes_the_run_and_adds_the_map_index():
    ti = task_instance("dag/task/manual__2025-01-01T00:00:00+00:00/3/1")
    assert task_instance_url(ti, "/airflow") == (
        "/airflow/dags/dag/runs/manual__2025-01-01T00%3A00%3A00%2B00%3A00/tasks/task"
        "/mapped/3")


def test_usage_history_steps_and_fair_share():
    jobs = [  # vision held 8 GPUs from 50 to 20 minutes ago; nlp 4 from 30 minutes ago on
        {"team": "vision", "spec": {"roles": [{"gpus": 8}]}, "submitted_at": at(55),
         "admitted_at": at(50), "finished_at": at(20)},
        {"team": "nlp", "spec": {"roles": [{"gpus": 2, "replicas": 2}]},
         "submitted_at": at(40), "admitted_at": at(30), "finished_at": None},
        {"team": "old", "spec": {"roles": [{"gpus": 8}]}, "submitted_at": at(200),
         "admitted_at": at(190), "finished_at": at(120)},       # before the window
    ]
    h = usage_history(jobs, {"vision": 2.0, "nlp": 1.0}, 12, NOW, 3600)
    assert "old" not in h

    def value(points, minutes_ago):      # the step function's value then
        t = NOW.timestamp() - minutes_ago * 60
        return [v for at_, v in points if at_ <= t][-1]

    assert [value(h["vision"].held, m) for m in (58, 45, 25, 10, 0)] == [0, 8, 8, 0, 0]
    assert [value(h["nlp"].held, m) for m in (58, 35, 25, 0)] == [0, 0, 4, 4]
    # a fair share is what a team asks for, at most: 8 of 12 while vision alone asked,
    # 8 and 4 when both did (12 split 2:1), then nlp's 4
    assert [value(h["vision"].fair, m) for m in (58, 45, 30, 10)] == [0, 8, 8, 0]
    assert [value(h["nlp"].fair, m) for m in (45, 30, 10)] == [0, 4, 4]
    assert gpu_hours(h["vision"].held) == pytest.approx(8 * 0.5)
    assert gpu_hours(h["nlp"].held) == pytest.approx(4 * 0.5)


def test_fair_shares_fill_by_weight_up_to_demand_and_quota():
    assert fair_shares({"a": 100, "b": 100}, {"a": 2, "b": 1}, {}, 30) == \
        {"a": 20, "b": 10}
    assert fair_shares({"a": 2, "b": 100}, {}, {}, 10) == {"a": 2, "b": 8}
    assert fair_shares({"a": 20, "b": 20}, {"a": 2, "b": 1}, {"a": 16}, 31) == \
        {"a": 16, "b": 15}
    assert fair_shares({"a": 0, "b": 3}, {}, {"b": None}, 10) == {"a": 0, "b": 3}


def test_teams_page_charts_and_step_polyline():
    teams = [{"name": "vision", "share": 2.0, "quota_gpus": 4, "held_gpus": 2}]
    page = teams_page(teams, LIVE, CLUSTER, NOW, 3600)
    (row,) = page["teams"]
    assert page["usable_gpus"] == 3        # host a: 3 healthy; b unreachable; c drained
    assert (row["held_gpus"], row["quota_pct"], row["fair_gpus"]) == (2, 50, 2)
    assert row["chart"]["quota_y"] is not None
    assert polyline([(0, 0), (50, 2), (100, 2)], 0, 100, 4) == \
        "0.0,90.0 180.0,90.0 180.0,47.0 360.0,47.0"


def test_teams_page_shows_guarantee_borrowing_limit_borrowed_and_lent():
    teams = [{"name": "vision", "share": 2.0, "quota_gpus": 1, "borrow_gpus": 2,
              "held_gpus": 2, "borrowed_gpus": 1, "lent_gpus": 0},
             {"name": "nlp", "share": 1.0, "quota_gpus": 2, "borrow_gpus": 0,
              "held_gpus": 0, "borrowed_gpus": 0, "lent_gpus": 1},
             {"name": "research", "share": 1.0, "quota_gpus": None, "borrow_gpus": None,
              "held_gpus": 0, "borrowed_gpus": 0, "lent_gpus": 0}]
    page = teams_page(teams, LIVE, CLUSTER, NOW, 3600)
    rows = {r["name"]: r for r in page["teams"]}
    assert [(rows[t]["quota_gpus"], rows[t]["borrow"], rows[t]["limit_gpus"],
             rows[t]["borrowed_gpus"], rows[t]["lent_gpus"])
            for t in ("vision", "nlp", "research")] == [
        (1, "+2", 3, 1, 0), (2, "none (hard quota)", 2, 0, 1), (None, "—", None, 0, 0)]
    # vision's 2 running GPUs are within what it may hold (1 + 2): its fair share is 2
    assert rows["vision"]["fair_gpus"] == 2 and rows["vision"]["quota_pct"] == 100
    assert borrow_label(4, None) == "no limit"
    assert limit_gpus({"quota_gpus": 4, "borrow_gpus": None}) is None
    assert limit_gpus({"quota_gpus": 4}) == 4           # an older service: a hard quota


VICTIM = {**LIVE[0], "state": "preempting", "borrowed": True, "preempted_by": "id-urgent",
          "preempt_reason": "preempted by job id-urgent (reclaim: ...)",
          "preempt_signal": "SIGUSR1", "preempt_grace": 60, "preemptions": 1,
          "preempt_deadline_at": (NOW + timedelta(seconds=70)).isoformat(), "attempt": 1}
URGENT = pending("urgent", 100, 1, code="Preempting",
                 reason="preempting j1 (reclaim): starts when they have stopped",
                 details={"victims": ["j1"], "preempt_reason": "reclaim"}, eta_seconds=70)


def test_queue_marks_borrowed_work_and_names_what_a_preemption_stops():
    requeued = {**pending("again", 0, 9), "requeue_reason": "preempted", "preemptions": 2}
    page = queue_page([URGENT, requeued], [VICTIM], NOW)
    first, second = page["pending"]
    assert first["code"] == "Preempting" and first["blockers"] == []
    assert first["victims"] == [{"id": "j1", "name": "train"}]
    assert first["reason"] == "preempting train (reclaim): starts when they have stopped"
    assert second["victims"] == [] and second["requeued"] == "preempted 2x, requeued"
    (live,) = page["live"]
    assert (live["state"], live["borrowed"], live["stops_in"]) == ("preempting", True, "1m10s")
    assert live["preempted_by"] == {"id": "id-urgent", "name": "urgent"}
    assert queue_page([], LIVE, NOW)["live"][0]["borrowed"] is False
    html = client(FakeSource(pending=[URGENT, requeued], live=[VICTIM])).get("/queue").text
    assert '<span class="tag borrowed"' in html and "for <a href=" in html
    assert 'preempts <a href="/jobs/j1">train</a>' in html
    assert "preempted 2x, requeued" in html


def test_job_page_shows_who_preempted_it_and_how_it_stops():
    explain = {"code": None, "reason": None, "eta_seconds": None, "details": {},
               "events": []}
    m = job_page(VICTIM, explain, CLUSTER, [VICTIM], NOW, pending=[URGENT])
    p = m["preemption"]
    assert p["borrowed"] and p["preempted_by"] == {"id": "id-urgent", "name": "urgent"}
    assert (p["signal"], p["grace"], p["deadline_in"], p["preemptions"]) == (
        "SIGUSR1", "1m", "1m10s", 1)
    assert job_page(LIVE[0], explain, CLUSTER, LIVE, NOW)["preemption"] is None
    back = {**URGENT, "requeue_reason": "preempted", "preemptions": 1, "attempt": 1,
            "preempted_by": "id-other"}
    m = job_page(back, {**explain, "code": "Preempting",
                        "details": {"victims": ["j1"]}}, CLUSTER, [VICTIM], NOW)
    assert m["victims"] == [{"id": "j1", "name": "train"}]
    assert m["preemption"]["requeue_reason"] == "preempted"
    assert m["preemption"]["preempted_by"] == {"id": "id-other", "name": "id-other"}
    html = client(FakeSource(live=[VICTIM], job=VICTIM, pending=[URGENT])).get(
        "/jobs/j1").text
    assert 'id="preempted-by">Preempted by <a href="/jobs/id-urgent">urgent</a>' in html
    assert "get SIGUSR1, then SIGKILL after 1m" in html


class FakeSource:
    """What the scheduler would answer, for rendering without one."""

    def __init__(self, fail: SourceError | None = None, live: list[dict] = LIVE,
                 pending: list[dict] = (), job: dict = LIVE[0]):
        self.fail, self.live, self.pending, self.one = fail, live, list(pending), job

    def _answer(self, value):
        if self.fail:
            raise self.fail
        return value

    def cluster(self):
        return self._answer(CLUSTER)

    def live_jobs(self):
        return self._answer(self.live)

    def jobs(self, state=None, newest=False, limit=1000):
        if state == "pending":
            return self._answer(self.pending)
        return self._answer(self.live if state in (None, "running") else [])

    def job(self, job_id):
        return self._answer(self.one)

    def explain(self, job_id):
        return self._answer({"code": None, "reason": None, "eta_seconds": None,
                             "details": {}, "events": []})

    def teams(self):
        return self._answer([{"name": "vision", "share": 1.0, "quota_gpus": None,
                              "held_gpus": 2}])


def client(source) -> TestClient:
    app = create_app(source)
    app.dependency_overrides[require_login] = lambda: None
    return TestClient(app)


def test_cluster_page_renders_utilization_and_unreachable_hosts():
    html = client(FakeSource()).get("/cluster").text
    assert 'data-host="b" data-status="unreachable"' in html
    assert "<em>87%</em>" in html and "memory 40%, 250 W" in html
    assert html.count('class="util"') == 1          # only GPUs with a sample show a bar


def test_pages_may_load_and_be_framed_only_from_their_own_origin():
    r = client(FakeSource()).get("/cluster")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "frame-ancestors 'self'" in r.headers["content-security-policy"]


def test_fragment_is_only_the_main_block():
    body = client(FakeSource()).get("/queue?fragment=1").text
    assert "<html" not in body and 'id="live"' in body


def test_scheduler_trouble_is_a_banner_naming_the_fix():
    why = SourceError(502, "cannot reach the scheduler at http://x:1 (connection "
                      "'gpu_scheduler_default')")
    c = client(FakeSource(why))
    r = c.get("/cluster")
    assert r.status_code == 502 and "cannot reach the scheduler at http://x:1" in r.text
    assert c.get("/api/cluster").json() == {"detail": why.message}
    r = c.get("/cluster?fragment=1")           # what the refreshing script shows
    assert r.status_code == 502 and r.text.startswith("cannot reach the scheduler")


def test_bad_arguments_name_the_field():
    c = client(FakeSource())
    assert c.get("/teams?window=90d").status_code == 422
    assert c.get("/jobs/..%2F..").status_code in (404, 422)
    assert c.get("/static/secret.py").status_code == 404
