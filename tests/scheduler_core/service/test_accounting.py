"""Per-job GPU accounting and the idle-GPU policy through the real service and its store
(SQLite and PostgreSQL): reports of a host's GPUs are attributed to the jobs holding them
and integrated; the accounting API equals the integral of the samples fed; a job idle
past the threshold is flagged and, with the requeue action, stopped and requeued."""

from __future__ import annotations

import time

import pytest

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from tests.databases import serve
from tests.scheduler_core.api.test_api import auth, spec, submit
from tests.scheduler_core.service.test_reclaim_and_requeue import beat, job

STEP = 0.25          # seconds between two reports


def report(api, host: str, gpus: dict[int, dict]) -> tuple[float, float]:
    """POST one report of `host` (GPU index -> fields); the bounds of the time the service
    stamps it with (before the request was sent, after its answer came)."""
    before = time.time()
    r = api.post(f"/api/v1/hosts/{host}/report", headers=auth(api, "admin"),
                 json={"gpus": [{"index": i, "healthy": True, **g} for i, g in gpus.items()]})
    assert r.status_code == 200, r.text
    return before, time.time()


def running(api, name: str, gpus: int, team: str = "vision") -> dict:
    j = submit(api, team, spec(name, gpus)).json()
    api.tick()
    return beat(api, job(api, j["id"], team), team)


def trapezoids(times: list[tuple[float, float]], values: list[float]) -> tuple[float, float]:
    """The least and the most the trapezoid integral of `values` can be when the i-th
    sample was stamped anywhere within `times[i]` (the integral is linear in each stamp,
    so each bound takes every stamp at one end of its interval)."""
    n, lo, hi = len(values), 0.0, 0.0
    for i, (before, after) in enumerate(times):
        left = values[i - 1] if i > 0 else -values[0]        # d(integral)/d(stamp i) * 2
        right = values[i + 1] if i < n - 1 else -values[-1]
        slope = (left - right) / 2
        lo += min(slope * before, slope * after)
        hi += max(slope * before, slope * after)
    return lo, hi


def within(value: float, bounds: tuple[float, float], slack: float = 1e-6) -> bool:
    return bounds[0] - slack <= value <= bounds[1] + slack


@pytest.fixture
def api(db_url):
    yield from serve(db_url)


def test_reports_are_integrated_per_job_and_equal_the_fed_samples(api):
    a = running(api, "a", 4)
    (rep,) = a["replicas"]
    host, held = rep["host"], rep["gpus"]
    free = next(g for g in range(8) if g not in held)
    utils, powers, mems, times = [0, 40, 80, 100, 0, 0], [60, 200, 300, 400, 70, 65], \
        [1, 5, 9, 7, 3, 3], []
    for k in range(len(utils)):
        fed = {g: {"utilization_gpu": utils[k] - (g == held[0]) * (utils[k] > 0),
                   "power_watts": powers[k], "memory_used_bytes": mems[k] * 2**30}
               for g in held}
        fed[free] = {"utilization_gpu": 99.0, "power_watts": 500.0}   # held by nobody
        times.append(report(api, host, fed))
        time.sleep(STEP)
    use = api.get(f"/api/v1/jobs/{a['id']}/usage", headers=auth(api, "nlp")).json()
    n = len(held)
    ones = [1.0] * len(utils)        # the integral of 1: the time the samples span
    span = trapezoids(times, ones)
    assert within(use["sampled_gpu_seconds"], (span[0] * n, span[1] * n))
    per_gpu = [trapezoids(times, [u - (g == held[0]) * (u > 0) for u in utils]) for g in held]
    util_integral = use["utilization_mean"] * use["sampled_gpu_seconds"]
    assert within(util_integral, (sum(b[0] for b in per_gpu), sum(b[1] for b in per_gpu)),
                  slack=0.5)     # the mean is rounded
    assert use["utilization_peak"] == 100
    assert use["memory_peak_bytes"] == 9 * 2**30
    energy = trapezoids(times, powers)
    assert within(use["energy_joules"], (energy[0] * n, energy[1] * n), slack=1.0)
    # at 0 %: the last interval of every GPU (both ends at zero)
    zero = trapezoids(times[-2:], [1.0, 1.0])
    assert within(use["zero_utilization_seconds"], (zero[0] * n, zero[1] * n))
    assert use["gpu_seconds"] >= span[0] * n
    (r,) = use["replicas"]
    assert (r["host"], r["gpus"], r["utilization_peak"]) == (host, held, 100)
    assert use["series"] and all(p["utilization_gpu"] is not None for p in use["series"])

    acct = api.get("/api/v1/accounting", headers=auth(api, "vision")).json()
    (row,) = [x for x in acct["rows"] if x["job"] == a["id"]]
    assert (row["gpus"], row["team"], row["state"]) == (4, "vision", "running")
    assert row["energy_joules"] == pytest.approx(use["energy_joules"])
    before = time.time()
    teams = api.get("/api/v1/accounting", params={"by": "team"},
                    headers=auth(api, "vision")).json()["rows"]
    assert [(t["team"], t["jobs"]) for t in teams] == [("vision", 1)]
    days = api.get("/api/v1/accounting", params={"by": "day"},
                   headers=auth(api, "vision")).json()["rows"]
    # the job still runs: its grant grew by at most its GPUs x the time between the two
    held, per_day = sum(t["gpu_seconds"] for t in teams), sum(d["gpu_seconds"] for d in days)
    assert held - 0.01 <= per_day <= held + n * (time.time() - before) + 0.01


def test_an_energy_counter_wins_over_the_power_integral(api):
    a = running(api, "a", 1)
    host, (gpu,) = a["replicas"][0]["host"], a["replicas"][0]["gpus"]
    for k in range(3):
        report(api, host, {gpu: {"utilization_gpu": 50.0, "power_watts": 1000.0,
                                 "energy_joules": 5000.0 + 123.0 * k}})
        time.sleep(0.05)
    use = api.get(f"/api/v1/jobs/{a['id']}/usage", headers=auth(api, "vision")).json()
    assert use["energy_joules"] == pytest.approx(246.0)
    # sacct -j: a unique id prefix or the job's name, as everywhere else
    for ref in (a["id"][:8], a["name"]):
        rows = api.get("/api/v1/accounting", params={"job": ref},
                       headers=auth(api, "vision")).json()["rows"]
        assert [r["job"] for r in rows] == [a["id"]], ref
    r = api.get("/api/v1/accounting", params={"job": "no-such-job"},
                headers=auth(api, "vision"))
    assert r.status_code == 404 and "no-such-job" in r.text


def test_a_window_that_ends_before_it_starts_names_the_field(api):
    r = api.get("/api/v1/accounting", params={"since": "2026-11-30T00:00:00",
                                              "until": "2026-11-01T00:00:00"},
                headers=auth(api, "vision"))
    assert r.status_code == 422 and "since" in r.text
    for params in ({"until": "0001-01-02T00:00:00"}, {"since": "9999-12-31T23:59:59"},
                   {"by": "day", "since": "1980-01-01T00:00:00"}):
        r = api.get("/api/v1/accounting", params=params, headers=auth(api, "vision"))
        assert r.status_code == 422, (params, r.text)
        assert ("out of range" if "by" not in params else "at most 3660 days") in r.text


@pytest.mark.parametrize("action", ["notify", "requeue"])
def test_an_idle_job_is_flagged_and_with_the_action_requeued(db_url, action):
    policy = PolicyConfig.model_validate({"idle": {"after": 1, "threshold": 5,
                                                   "action": action, "grace": 1}})
    for api in serve(db_url, policy):
        busy, idle = running(api, "busy", 4), running(api, "idle", 4)
        assert busy["replicas"][0]["host"] == idle["replicas"][0]["host"]
        host = busy["replicas"][0]["host"]
        fed = {**{g: {"utilization_gpu": 90.0} for g in busy["replicas"][0]["gpus"]},
               **{g: {"utilization_gpu": 2.0} for g in idle["replicas"][0]["gpus"]}}
        # flagged after 1 s under 5 %, requeued 1 s later: report until that happened (on
        # a loaded machine reports come slower), or give up after 30 s
        end, wanted = time.time() + 30, "running" if action == "notify" else "preempting"
        while True:
            report(api, host, fed)
            j = job(api, idle["id"])
            if (j["state"], j["idle_flagged_at"] is not None) == (wanted, True) \
                    or time.time() > end:
                break
            time.sleep(STEP)
        assert j["idle_flagged_at"] is not None and j["idle_since"] is not None
        assert job(api, busy["id"])["idle_flagged_at"] is None
        events = api.get(f"/api/v1/jobs/{idle['id']}/explain",
                         headers=auth(api, "vision")).json()["events"]
        assert any(e["kind"] == "idle" and "under 5 %" in e["message"] for e in events)
        metrics = api.get("/metrics").text
        assert 'airflow_gpu_idle_jobs{team="vision"} 1.0' in metrics
        assert f'hpc_job="{busy["id"]}"' in metrics
        if action == "notify":
            assert j["state"] == "running"
            # it works again: the flag goes
            report(api, host, {g: {"utilization_gpu": 50.0}
                               for g in idle["replicas"][0]["gpus"]})
            assert job(api, idle["id"])["idle_flagged_at"] is None
            continue
        assert j["state"] == "preempting" and j["preempted_by"] is None
        assert j["preempt_reason"].startswith("idle:")
        r = api.post(f"/api/v1/jobs/{idle['id']}/finish", headers=auth(api, "vision"),
                     json={"outcome": "preempted", "attempt": j["attempt"]})
        assert r.status_code == 200, r.text
        j = job(api, idle["id"])
        assert (j["state"], j["requeue_reason"], j["idle_flagged_at"]) == (
            "pending", "idle", None)
