"""A node agent's report costs the same statements however many jobs hold the host's
GPUs, through the real app and store (SQLite and PostgreSQL): one job, then eight, on
one host, with the idle policy on. And what the bulk path computes in memory holds where
the statements change: a report after midnight carries the last sample into the new
day's row; a job spread over two hosts is flagged idle only once both have reported its
GPUs idle; a job class's idle settings win over the policy's. Only a report that changes
what a pass reads (health, reachability, a job's state) wakes the scheduling loop."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, select

from airflow_gpu.scheduler_core.jobclasses import JobClass
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.service import hosts
from airflow_gpu.scheduler_core.store.models import UsageRow
from tests.databases import serve
from tests.scheduler_core.api.test_api import auth, spec, submit
from tests.scheduler_core.service.test_reclaim_and_requeue import beat, job

ONE = ({"name": "dgx-1", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
TWO = ({"name": "dgx-[1-2]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)
IDLE = {"idle": {"after": 3600, "threshold": 5}}
SAMPLES = "INSERT INTO job_samples"


CACHED = ("FROM tokens", "FROM teams")     # read at most once a second, whatever the route


class Statements:
    """The statements the service's write engine sends while counting, but those of the
    caches every request shares (a token's principal, the policy's teams)."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []

    def __enter__(self):
        event.listen(self.engine, "before_cursor_execute", self._one)
        return self

    def __exit__(self, *exc):
        event.remove(self.engine, "before_cursor_execute", self._one)

    def _one(self, conn, cursor, statement, params, context, executemany):
        if not any(c in statement for c in CACHED):
            self.seen.append(" ".join(statement.split()))


def report(api, host: str, util: float, at: datetime | None = None,
           monkeypatch=None) -> list[str]:
    """POST a report of all 8 GPUs of `host` (stamped `at` where given); the statements
    it took."""
    if at is not None:
        monkeypatch.setattr(hosts, "utcnow", lambda: at)
    body = {"gpus": [{"index": g, "healthy": True, "utilization_gpu": util,
                      "memory_used_bytes": 2**30, "power_watts": 300.0} for g in range(8)]}
    with Statements(api.service.engine) as st:
        r = api.post(f"/api/v1/hosts/{host}/report", headers=auth(api, "admin"), json=body)
    assert r.status_code == 200, r.text
    return st.seen


def start(api, n: int, gpus: int = 1) -> list[dict]:
    ids = [submit(api, "vision", spec(f"j{k}", gpus)).json()["id"] for k in range(n)]
    assert sorted(api.tick()) == sorted(ids)
    return [beat(api, job(api, i)) for i in ids]


def steady(seen: list[str]) -> list[str]:
    # a series point is one insert for all jobs, at the first report of each 30 s
    assert sum(s.startswith(SAMPLES) for s in seen) <= 1, seen
    return [s for s in seen if not s.startswith(SAMPLES)]


def test_a_report_costs_the_same_statements_with_one_job_and_with_eight(db_url):
    for api in serve(db_url, PolicyConfig.model_validate(IDLE), ONE):
        (a,) = start(api, 1)
        first_one = report(api, "dgx-1", 1.0)
        one = [steady(report(api, "dgx-1", 1.0)) for _ in range(3)]
        r = api.post(f"/api/v1/jobs/{a['id']}/finish", headers=auth(api, "vision"),
                     json={"outcome": "succeeded", "attempt": a["attempt"]})
        assert r.status_code == 200, r.text
        jobs = start(api, 8)
        first_eight = report(api, "dgx-1", 1.0)
        eight = [steady(report(api, "dgx-1", 1.0)) for _ in range(3)]
        # a job's first report reads its allocations, inserts its usage rows and its
        # series' first point, and marks it idle since: the same for one job as for eight
        assert len(first_eight) == len(first_one), (first_one, first_eight)
        assert one[0] == one[1] == one[2] and eight[0] == eight[1] == eight[2]
        assert len(eight[0]) == len(one[0]), (one[0], eight[0])
        # the holds with the usage rows, and their update: one statement for all jobs
        for start_, table in (("SELECT", "job_usage"), ("SELECT", "gpu_holds"),
                              ("UPDATE", "job_usage")):
            assert sum(s.startswith(start_) and table in s for s in eight[0]) == 1, (
                table, eight[0])
        # under the threshold since the first report, not for an hour: idle, not flagged
        assert all(job(api, j["id"])["idle_since"] is not None for j in jobs)
        rows = api.get("/api/v1/accounting", headers=auth(api, "vision")).json()["rows"]
        assert len(rows) == 9 and all(r["utilization_mean"] == 1 for r in rows), rows


def test_a_report_after_midnight_carries_the_last_sample_into_the_new_day(
        db_url, monkeypatch):
    for api in serve(db_url, hosts=ONE):
        (a,) = start(api, 1)
        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        report(api, "dgx-1", 40.0, midnight - timedelta(seconds=10), monkeypatch)
        report(api, "dgx-1", 60.0, midnight + timedelta(seconds=5), monkeypatch)
        report(api, "dgx-1", 60.0, midnight + timedelta(seconds=15), monkeypatch)
        with api.service.reads() as s:
            rows = list(s.scalars(select(UsageRow).where(UsageRow.job_id == a["id"])
                                  .order_by(UsageRow.day)))
        (gpu,) = a["replicas"][0]["gpus"]
        assert [(r.day, r.gpu, r.role) for r in rows] == [
            ((midnight - timedelta(days=1)).strftime("%Y-%m-%d"), gpu, "w"),
            (midnight.strftime("%Y-%m-%d"), gpu, "w")]
        before, after = rows
        assert before.sampled_seconds == 0 and before.util_peak == 40
        # 23:59:50 -> 00:00:05 (carried) and -> 00:00:15, both in the new day's row
        assert after.sampled_seconds == pytest.approx(25)
        assert after.util_seconds == pytest.approx(50 * 15 + 60 * 10)
        assert after.energy_joules == pytest.approx(300 * 25)


def test_a_job_on_two_hosts_is_flagged_idle_once_both_reported_it_idle(
        db_url, monkeypatch):
    policy = PolicyConfig.model_validate({"idle": {"after": 60, "threshold": 5}})
    for api in serve(db_url, policy, TWO):
        (a,) = start(api, 1, gpus=16)
        assert sorted(r["host"] for r in a["replicas"]) == ["dgx-1", "dgx-2"]
        t0 = datetime.now(UTC)
        report(api, "dgx-1", 1.0, t0, monkeypatch)
        report(api, "dgx-1", 1.0, t0 + timedelta(seconds=120), monkeypatch)
        assert job(api, a["id"])["idle_flagged_at"] is None      # dgx-2 has not reported
        report(api, "dgx-2", 90.0, t0 + timedelta(seconds=125), monkeypatch)
        report(api, "dgx-1", 1.0, t0 + timedelta(seconds=130), monkeypatch)
        assert job(api, a["id"])["idle_flagged_at"] is None      # dgx-2's GPUs are busy
        report(api, "dgx-2", 2.0, t0 + timedelta(seconds=135), monkeypatch)
        j = job(api, a["id"])
        assert j["idle_flagged_at"] is None and j["idle_since"] is not None
        # idle since dgx-2's GPUs went under the threshold, 60 s later it is flagged
        report(api, "dgx-1", 1.0, t0 + timedelta(seconds=194), monkeypatch)
        assert job(api, a["id"])["idle_flagged_at"] is None
        report(api, "dgx-1", 1.0, t0 + timedelta(seconds=196), monkeypatch)
        j = job(api, a["id"])
        assert j["idle_flagged_at"] is not None
        assert datetime.fromisoformat(j["idle_since"]) == t0 + timedelta(seconds=135)
        # one of its GPUs is used again: the flag goes
        report(api, "dgx-2", 80.0, t0 + timedelta(seconds=200), monkeypatch)
        assert job(api, a["id"])["idle_flagged_at"] is None


def test_only_a_report_that_changes_what_passes_read_wakes_the_loop(db_url):
    for api in serve(db_url, hosts=ONE):
        (a,) = start(api, 1)
        (gpu,) = a["replicas"][0]["gpus"]
        wake = api.service.wake
        for util in (10.0, 90.0, 0.0):     # utilization alone: the loop keeps its interval
            wake.clear()
            report(api, "dgx-1", util)
            assert not wake.is_set()
        body = {"gpus": [{"index": gpu, "healthy": False, "reason": "XID 79"}]}
        r = api.post("/api/v1/hosts/dgx-1/report", headers=auth(api, "admin"), json=body)
        assert r.status_code == 200, r.text
        assert wake.is_set()               # a GPU turned unhealthy: its job is requeued
        assert job(api, a["id"])["state"] == "pending"
        wake.clear()
        body["gpus"][0].update(healthy=True, reason=None)
        api.post("/api/v1/hosts/dgx-1/report", headers=auth(api, "admin"), json=body)
        assert wake.is_set()               # and healthy again: it takes work again


def test_a_job_class_s_idle_settings_win_over_the_policy(db_url, monkeypatch):
    policy = PolicyConfig.model_validate({"idle": {"after": 60, "threshold": 5}})
    for api in serve(db_url, policy, ONE):
        classes = api.service.reg.job_classes
        monkeypatch.setitem(classes, "notebook", JobClass(
            "notebook", "interactive", idle_after=30, idle_threshold=50))
        monkeypatch.setitem(classes, "quiet", JobClass("quiet", "never idle", idle_after=0))
        ids = {}
        for name in ("plain", "notebook", "quiet"):
            body = {**spec(name, 1), **({"job_class": name} if name != "plain" else {})}
            ids[name] = submit(api, "vision", body).json()["id"]
        api.tick()
        for i in ids.values():
            beat(api, job(api, i))
        t0 = datetime.now(UTC)
        for dt in (0, 20, 40, 70):        # 20 %: under the notebook's 50, over the policy's 5
            report(api, "dgx-1", 20.0, t0 + timedelta(seconds=dt), monkeypatch)
        got = {name: job(api, i) for name, i in ids.items()}
        assert got["notebook"]["idle_flagged_at"] is not None
        assert datetime.fromisoformat(got["notebook"]["idle_since"]) == t0
        for name in ("plain", "quiet"):
            assert (got[name]["idle_since"], got[name]["idle_flagged_at"]) == (None, None)
