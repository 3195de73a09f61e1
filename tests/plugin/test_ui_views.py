"""The page models and templates without a server: what the scheduler's JSON becomes,
including parts the demo stack cannot produce (unreachable hosts, utilization)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_gpu.plugin.source import SourceError
from airflow_gpu.plugin.views.cluster import cluster_page, nvlink_label
from airflow_gpu.plugin.views.job import job_page, task_instance, task_instance_url
from airflow_gpu.plugin.views.queue import queue_page
from airflow_gpu.plugin.views.teams import borrow_label, limit_gpus, polyline, teams_page
from airflow_gpu.plugin.views.usage_chart import nice_ceiling, usage_chart
from airflow_gpu.plugin.views.usage_history import fair_shares, gpu_hours, usage_history
from tests.plugin.viewdata import CLUSTER, LIVE, NOW, FakeSource, at, client, pending


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
    assert page["racks"][1]["switches"][0]["hosts"][0]["drain_reason"] == "PSU swap"
    assert a["drain_reason"] is None
    assert page["summary"] == {"hosts": 3, "gpus_total": 12, "gpus_held": 2, "gpus_free": 1,
                               "gpus_unhealthy": 1, "hosts_drained": 1,
                               "hosts_unreachable": 1, "mig_devices": 0, "mig_free": 0}
    assert page["teams"][0]["name"] == "vision"


def test_nvlink_labels():
    assert nvlink_label({"fabric": "nvswitch", "groups": [list(range(8))]}, 8)["text"] == \
        "NVLink (nvswitch): all 8 GPUs in one group"
    assert nvlink_label({"fabric": "direct", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]},
                        8)["text"] == "NVLink (direct) groups A: GPU 0-3, B: GPU 4-7"
    assert nvlink_label({"fabric": "none", "groups": [[0], [1]]}, 2)["text"] == \
        "no NVLink between GPUs"
    assert nvlink_label(None, 2)["text"] == "NVLink: not reported"


def test_queue_keeps_the_schedulers_order_and_names_blockers():
    """The page shows the scheduler's rank (GET /api/v1/queue), not a sort of its own:
    here the lowest priority is first (say, its band holds a job-class weight)."""
    page = queue_page([pending("held", 9, 9, rank=None), pending("high", 9, 1, rank=2),
                       pending("low", 0, 50, rank=1, band=20.0, score=0.5)], LIVE, NOW)
    assert [p["name"] for p in page["pending"]] == ["low", "high", "held"]
    assert [p["rank"] for p in page["pending"]] == [1, 2, None]
    first = page["pending"][0]
    assert (first["band"], first["score"]) == (20.0, 0.5)
    assert first["reason"] == "held by train (2)"
    assert first["blockers"] == [{"id": "j1", "name": "train", "gpus": 2}]
    assert first["eta"] == "in 10m" and first["waiting"] == "50m"
    (live,) = page["live"]
    assert live["placement"] == [{"host": "a", "gpus": "GPU 0-1"}]
    assert (live["elapsed"], live["expected"], live["progress"]) == ("20m", "1h", 33)
    body = client(FakeSource(pending=page_input())).get("/queue").text
    assert body.index('data-name="low"') < body.index('data-name="high"')


def page_input() -> list[dict]:
    return [pending("high", 9, 1, rank=2), pending("low", 0, 50, rank=1, band=0.0,
                                                   score=0.25)]


def test_a_long_list_of_blocking_jobs_is_cut():
    held = {f"j{i}": 20 - i for i in range(15)}
    (row,) = queue_page([pending("gang", 0, 5, rank=1, details={"held_by": held})], [],
                        NOW)["pending"]
    assert [b["id"] for b in row["blockers"]] == [f"j{i}" for i in range(12)]
    assert row["blockers_more"] == 3
    body = client(FakeSource(pending=[pending("gang", 0, 5, rank=1,
                                              details={"held_by": held})])).get("/queue").text
    assert "j11</a> (9 GPUs) and 3 more" in body


def test_pending_job_page_shows_its_reservation():
    job = pending("big", 5, 10, details={"held_by": {"j1": 2}, "reserved_hosts": ["a", "c"],
                                         "reserved_gpus": {"a": [0, 1, 2], "c": [0]}},
                  eta_seconds=5400)
    explain = {"code": "Resources", "reason": "held by j1 (2)", "eta_seconds": 5400,
               "details": job["pending"]["details"], "events": []}
    page = job_page(job, explain, CLUSTER, LIVE, NOW)
    assert page["reservation"] == {
        "hosts": [{"host": "a", "rack": "r1", "switch": "s1", "gpus": "GPU 0-2",
                   "held_by": [{"id": "j1", "name": "train"}]},
                  {"host": "c", "rack": "r2", "switch": "s3", "gpus": "GPU 0",
                   "held_by": []}],
        "start": "2025-06-01 13:30 UTC", "in": "1h30m", "tier": None}
    job["pending"]["details"] = explain["details"] = {"held_by": {"j1": 2}}
    assert job_page(job, explain, CLUSTER, LIVE, NOW)["reservation"] is None


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



SERIES = [{"at": at(2), "utilization_gpu": 0.0, "memory_used_bytes": 2**30,
           "power_watts": 100.0},
          {"at": at(1), "utilization_gpu": 50.0, "memory_used_bytes": 2**31,
           "power_watts": 200.0},
          {"at": at(0), "utilization_gpu": 100.0, "memory_used_bytes": 2**31,
           "power_watts": 300.0}]
TOTALS = {"gpu_seconds": 5400.0, "gpu_hours": 1.5, "sampled_gpu_seconds": 3600.0,
          "utilization_mean": 73.4321, "utilization_peak": 97.0,
          "memory_peak_bytes": 40 * 2**30, "energy_joules": 4.5e6,
          "zero_utilization_seconds": 600.0}
USAGE = {"job": "j1", "name": "train", "team": "vision", "state": "running",
         "idle_since": None, "idle_flagged_at": None, **TOTALS,
         "replicas": [{"role": "w", "index": 0, "host": "a", "gpus": [0, 1], **TOTALS,
                       "energy_joules": 1234.4}],
         "series": SERIES}


def test_usage_chart_draws_one_point_per_sample_on_a_0_to_100_axis():
    c = usage_chart(SERIES)
    assert not c["empty"] and c["samples"] == 3
    # 0, 50 and 100 %: bottom, middle and top of the plot; first to last sample across it
    assert c["util"] == ["36.0,142.0 315.0,75.0 594.0,8.0"] and c["util_dots"] == []
    assert [g["label"] for g in c["grid"]] == ["0 %", "50 %", "100 %"]
    assert [g["y"] for g in c["grid"]] == [142.0, 75.0, 8.0]
    assert (c["start"], c["end"], c["span"]) == ("2025-06-01 11:58:00", "12:00:00", "2m")
    # power on its own axis, up to a round number: 300 W of 500
    assert c["power_top"] == "500 W" and len(c["power"][0].split(" ")) == 3
    assert usage_chart(SERIES, power=False)["power"] is None
    assert nice_ceiling(300) == 500 and nice_ceiling(1800) == 2000 and nice_ceiling(0) == 1


def test_usage_chart_breaks_the_line_where_samples_are_missing():
    series = [{"at": at(m), "utilization_gpu": u, "power_watts": None}
              for m, u in ((60, 10.0), (59, 20.0), (58, None), (57, 30.0), (56, 40.0),
                           (55, 50.0), (5, 60.0))]        # 50 minutes without a report
    c = usage_chart(series)
    assert [len(line.split(" ")) for line in c["util"]] == [2, 3]
    assert len(c["util_dots"]) == 1 and c["util_dots"][0]["x"] == 594.0   # the lone last
    assert c["power"] is None and c["power_top"] is None
    assert (c["start"], c["end"]) == ("2025-06-01 11:00", "11:55")
    days = usage_chart([{"at": at(60 * 24 + 1), "utilization_gpu": 1.0},
                        {"at": at(0), "utilization_gpu": 2.0}])
    assert (days["start"], days["end"]) == ("2025-05-31 11:59", "2025-06-01 12:00")
    assert usage_chart([]) == {**usage_chart([]), "empty": True, "samples": 0}


def test_job_page_accounting_rows_and_an_unavailable_usage():
    explain = {"code": None, "reason": None, "eta_seconds": None, "details": {},
               "events": []}
    a = job_page(LIVE[0], explain, CLUSTER, LIVE, NOW, usage=USAGE)["accounting"]
    assert a["available"]
    assert {k: a[k] for k in ("gpu_hours", "utilization_mean", "utilization_peak",
                              "memory_peak", "energy", "zero_time", "zero_pct",
                              "sampled")} == {
        "gpu_hours": "1.50", "utilization_mean": "73.4 %", "utilization_peak": "97 %",
        "memory_peak": "40GiB", "energy": "1.25 kWh", "zero_time": "10m",
        "zero_pct": 16.7, "sampled": "1h"}
    (r,) = a["replicas"]
    assert (r["role"], r["index"], r["host"], r["gpus"], r["energy"]) == (
        "w", 0, "a", "0-1", "1,234 J")
    assert a["chart"]["util"] == usage_chart(SERIES)["util"]
    # declared hosts without a node agent: GPU-hours granted, nothing sampled
    bare = {**USAGE, "sampled_gpu_seconds": 0.0, "utilization_mean": None,
            "utilization_peak": None, "memory_peak_bytes": None, "energy_joules": 0.0,
            "zero_utilization_seconds": 0.0, "gpu_hours": 0.004, "replicas": [],
            "series": []}
    a = job_page(LIVE[0], explain, CLUSTER, LIVE, NOW, usage=bare)["accounting"]
    assert (a["gpu_hours"], a["utilization_mean"], a["memory_peak"], a["energy"],
            a["zero_time"], a["chart"]["empty"]) == ("< 0.01", "—", "—", "—", "—", True)
    a = job_page(LIVE[0], explain, CLUSTER, LIVE, NOW, usage_error="no usage endpoint")
    assert a["accounting"] == {"available": False, "error": "no usage endpoint"}


def test_job_page_renders_the_accounting_and_the_utilization_chart():
    html = client(FakeSource(usage=USAGE)).get("/jobs/j1").text
    assert 'id="usage-chart"' in html and "<script" not in html.split("<main")[1]
    assert '<polyline class="util" points="36.0,142.0 315.0,75.0 594.0,8.0"/>' in html
    assert 'class="axis time-start">2025-06-01 11:58:00<' in html
    assert 'class="axis time-end" text-anchor="end">12:00:00<' in html
    assert ">100 %</text>" in html and ">0 %</text>" in html
    assert "<b>1.50</b> GPU-hours granted" in html and "<b>1.25 kWh</b> energy" in html
    assert 'id="usage-replicas"' in html
    html = client(FakeSource(usage={**USAGE, "series": []})).get("/jobs/j1").text
    assert 'id="usage-chart-empty"' in html and "no samples yet" in html
    r = client(FakeSource()).get("/jobs/j1")          # an older service: 404 on /usage
    assert r.status_code == 200 and 'id="replicas"' in r.text
    assert "Accounting unavailable: this scheduler has no usage endpoint" in r.text
    assert client(FakeSource()).get("/api/jobs/j1").json()["accounting"]["available"] is False


IDLE = {**LIVE[0], "idle_since": at(45), "idle_flagged_at": at(15)}
IDLE_STOP = {**IDLE, "state": "preempting", "preempted_by": None,
             "preempt_reason": "idle: its GPUs stayed under 5 % utilization for 45m "
                               "(idle policy action: requeue)",
             "preempt_signal": "SIGTERM", "preempt_grace": 30,
             "preempt_deadline_at": (NOW + timedelta(seconds=40)).isoformat()}


def test_idle_flag_on_the_job_and_queue_pages():
    explain = {"code": None, "reason": None, "eta_seconds": None, "details": {},
               "events": []}
    m = job_page(IDLE, explain, CLUSTER, [IDLE], NOW)
    assert m["idle"] == {"since": "2025-06-01 11:15:00 UTC",
                         "flagged_at": "2025-06-01 11:45:00 UTC", "for": "45m",
                         "live": True}
    assert job_page(LIVE[0], explain, CLUSTER, LIVE, NOW)["idle"] is None
    html = client(FakeSource(live=[IDLE], job=IDLE)).get("/jobs/j1").text
    assert "GPUs idle since 2025-06-01 11:15:00 UTC" in html
    assert "flagged by the idle-GPU policy" in html
    back = {**pending("again", 0, 3), "requeue_reason": "idle", "attempt": 2}
    page = queue_page([back], [IDLE], NOW)
    assert page["pending"][0]["requeued"] == "requeued: idle GPUs"
    (live,) = page["live"]
    assert (live["idle"], live["idle_for"], live["idle_stop"]) == (True, "45m", False)
    assert queue_page([], LIVE, NOW)["live"][0]["idle"] is False
    html = client(FakeSource(pending=[back], live=[IDLE])).get("/queue").text
    assert '<span class="tag idle"' in html and "requeued: idle GPUs" in html
    m = job_page(back, explain, CLUSTER, [], NOW)
    assert m["preemption"]["requeue_label"] == "idle GPUs"


def test_a_job_the_idle_policy_stops_names_no_preemptor():
    explain = {"code": None, "reason": None, "eta_seconds": None, "details": {},
               "events": []}
    p = job_page(IDLE_STOP, explain, CLUSTER, [IDLE_STOP], NOW)["preemption"]
    assert p["preempted_by"] is None and p["idle_stop"]
    (live,) = queue_page([], [IDLE_STOP], NOW)["live"]
    assert live["preempted_by"] is None and live["idle_stop"]
    html = client(FakeSource(live=[IDLE_STOP], job=IDLE_STOP)).get("/jobs/j1").text
    assert "Being stopped by the idle-GPU policy" in html and 'id="preempted-by"' not in html
    assert "None" not in html.split('id="preemption"')[1].split("</section>")[0]
    assert "get SIGTERM, then SIGKILL after 30s" in html
    html = client(FakeSource(live=[IDLE_STOP])).get("/queue").text
    assert "stopped by the idle-GPU policy within " in html and "None" not in html


def test_cluster_page_renders_utilization_and_unreachable_hosts():
    html = client(FakeSource()).get("/cluster").text
    assert 'data-host="b" data-status="unreachable"' in html
    assert "<em>87%</em>" in html and "memory 40%, 250 W" in html
    assert html.count('class="util"') == 1          # only GPUs with a sample show a bar
    assert '<span class="drain-reason">PSU swap</span>' in html
    CLUSTER["hosts"][0]["nvlink_domain"] = "nvl-1"
    try:
        html = client(FakeSource()).get("/cluster").text
    finally:
        del CLUSTER["hosts"][0]["nvlink_domain"]
    assert 'NVLink domain <b class="domain">nvl-1</b>' in html


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


def test_the_cluster_page_shows_reservations_now_and_next():
    now = {"name": "fw", "maint": True, "teams": [], "state": "active", "hosts": ["c"],
           "start": at(30), "end": at(-90)}
    nxt = {"name": "demo", "maint": False, "teams": ["vision"], "state": "upcoming",
           "hosts": ["a"], "start": at(-60), "end": at(-180)}
    cluster = {**CLUSTER, "reservations": [now, nxt], "hosts": [
        {**CLUSTER["hosts"][0], "reservations": [nxt]}, CLUSTER["hosts"][1],
        {**CLUSTER["hosts"][2], "reservations": [now]}]}
    page = cluster_page(cluster, LIVE)
    assert [r["name"] for r in page["reservations"]] == ["fw", "demo"]
    a = page["racks"][0]["switches"][0]["hosts"][0]
    (r,) = a["reservations"]
    assert r["label"].startswith("demo (vision) ") and r["label"].endswith(" UTC")
    assert " to " in r["label"]
    c = page["racks"][1]["switches"][0]["hosts"][0]
    assert c["reservations"][0]["label"].startswith("fw (maintenance) until ")

    class Reserved(FakeSource):
        def cluster(self):
            return cluster

    body = client(Reserved()).get("/cluster").text
    assert 'id="reservations"' in body and 'data-reservation="fw"' in body
    assert "next: demo (vision)" in body and "reserved: fw (maintenance) until" in body


def test_a_deadline_at_risk_shows_on_the_queue_and_job_pages():
    risky = pending("nightly", 0, 30, rank=1, code="DeadlineAtRisk",
                    reason="deadline at risk: its pipeline is due in 2h ...")
    risky["spec"]["deadline"] = (NOW + timedelta(hours=2)).isoformat()
    (row,) = queue_page([risky], [], NOW)["pending"]
    assert row["due"] == "pipeline due in 2h (06-01 14:00 UTC)"
    explain = {"code": "DeadlineAtRisk", "reason": risky["pending"]["reason"],
               "eta_seconds": 600, "details": {}, "events": []}
    assert job_page(risky, explain, CLUSTER, LIVE, NOW)["due"] == row["due"]
    html = client(FakeSource(pending=[risky])).get("/queue").text
    assert '<span class="code risk">DeadlineAtRisk</span>' in html
    assert "pipeline due " in html and "(06-01 14:00 UTC)" in html
    plain = pending("plain", 0, 30, rank=1)
    (row,) = queue_page([plain], [], NOW)["pending"]
    assert row["due"] is None
    assert '<span class="code">Resources</span>' in client(
        FakeSource(pending=[plain])).get("/queue").text
