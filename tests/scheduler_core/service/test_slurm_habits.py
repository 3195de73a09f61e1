"""Slurm's and Grid Engine's habits through the API, on SQLite and PostgreSQL: job
references (id prefixes, names), blockers named in explain, the queue in the scheduler's
order (squeue), priority factors (sprio), fair share (sshare), hold and release, update,
requeue, drain reasons and the cluster's allocation per host and NUMA node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.store.models import HostRow, JobRow
from tests.databases import serve


def spec(name: str, gpus: int, runtime: str = "1h", **more) -> dict:
    roles = [{"name": "w", "replicas": gpus // 8, "gpus": 8}] if gpus > 8 else [
        {"name": "w", "gpus": gpus}]
    return {"name": name, "roles": roles, "expected_runtime": runtime, **more}


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submit(api, who: str, body: dict) -> dict:
    r = api.post("/api/v1/jobs", json={"spec": body}, headers=auth(api, who))
    assert r.status_code == 201, r.text
    return r.json()


def get(api, path: str, who: str = "vision", status: int = 200):
    r = api.get(path, headers=auth(api, who))
    assert r.status_code == status, r.text
    return r.json()


def post(api, path: str, who: str = "vision", status: int = 200, **kw):
    r = api.post(path, headers=auth(api, who), **kw)
    assert r.status_code == status, r.text
    return r.json()


def full(api) -> dict:
    """A job on both hosts (16 GPUs): everything submitted after it waits."""
    big = submit(api, "vision", spec("big", 16, "2h"))
    assert api.tick() == [big["id"]]
    return big


@pytest.fixture
def limited(db_url):
    """The policy caps time limits at a day."""
    yield from serve(db_url, PolicyConfig(max_time_limit=86400))


# -- job references ---------------------------------------------------------------------
def test_ids_prefixes_and_names_are_accepted_wherever_an_id_is(api):
    train = submit(api, "vision", spec("train", 8))
    other = submit(api, "vision", spec("other", 8))
    assert get(api, f"/api/v1/jobs/{train['id'][:6]}")["id"] == train["id"]
    assert get(api, "/api/v1/jobs/train")["id"] == train["id"]
    assert get(api, "/api/v1/jobs/other/explain")["id"] == other["id"]
    why = get(api, f"/api/v1/jobs/{train['id'][:3]}", status=404)["detail"]
    assert "at least 4 characters" in why
    assert "does not exist" in get(api, "/api/v1/jobs/nosuchjob", status=404)["detail"]
    # a name shared by two live jobs: 409 naming both
    twin = submit(api, "vision", spec("train", 1))
    why = get(api, "/api/v1/jobs/train", status=409)["detail"]
    assert train["id"] in why and twin["id"] in why and "ambiguous" in why
    # an ambiguous id prefix: 409 naming the candidates
    with api.service.sessions.begin() as s:
        for old, new in ((train["id"], "abcd1111" + train["id"][8:]),
                         (other["id"], "abcd2222" + other["id"][8:])):
            s.execute(update(JobRow).where(JobRow.id == old).values(id=new))
    why = get(api, "/api/v1/jobs/abcd", status=409)["detail"]
    assert "abcd1111" in why and "abcd2222" in why
    assert get(api, "/api/v1/jobs/abcd2")["name"] == "other"
    # cancel by name; once ended, the name still finds its newest job
    r = api.delete("/api/v1/jobs/other", headers=auth(api, "vision"))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert get(api, "/api/v1/jobs/other")["state"] == "cancelled"
    # heartbeat and finish take prefixes too; another team's job: 403 as before
    api.tick()
    assert get(api, f"/api/v1/jobs/{twin['id'][:8]}")["state"] == "admitted"
    post(api, f"/api/v1/jobs/{twin['id'][:8]}/heartbeat", "nlp", status=403)
    assert post(api, f"/api/v1/jobs/{twin['id'][:8]}/heartbeat")["state"] == "running"
    # no token: 401 before any lookup
    assert api.get("/api/v1/jobs/train").status_code == 401


def test_explain_names_blockers_by_name_and_id(api):
    big = full(api)
    waiting = submit(api, "nlp", spec("next", 8))
    api.tick()
    why = get(api, "/api/v1/jobs/next/explain", "nlp")
    assert why["code"] == "Resources"
    assert f"held by big ({big['id'][:8]})" in why["reason"]
    assert why["blockers"] == [{"id": big["id"], "name": "big", "team": "vision",
                                "state": "admitted"}]
    # the job itself (what run, the Airflow trigger and status print) names them too;
    # its details keep the ids
    for stored in (get(api, f"/api/v1/jobs/{waiting['id']}"),
                   get(api, "/api/v1/jobs?state=pending")[0]):
        assert f"held by big ({big['id'][:8]}) (16)" in stored["pending"]["reason"]
        assert stored["pending"]["details"]["held_by"] == {big["id"]: 16}


# -- queue, prio, share -----------------------------------------------------------------
def test_queue_and_priorities_follow_the_schedulers_order(api):
    big = full(api)
    a = submit(api, "vision", spec("a", 8, "10h"))
    b = submit(api, "vision", spec("b", 8, "1h", priority=5))
    c = submit(api, "vision", spec("c", 1, "1m"))
    v = submit(api, "nlp", spec("v", 1, "10m", job_class="validation"))
    api.tick()
    prio = get(api, "/api/v1/priorities")
    order = [j["name"] for j in prio["jobs"]]
    # band first (validation +10, then priority 5), then score: small work first
    assert order == ["v", "b", "c", "a"]
    assert [j["rank"] for j in prio["jobs"]] == [1, 2, 3, 4]
    by = {j["name"]: j for j in prio["jobs"]}
    assert (by["v"]["band"], by["v"]["class_weight"], by["b"]["band"]) == (10, 10, 5)
    for j in prio["jobs"]:
        assert j["score"] == pytest.approx(j["fairshare"] + j["size"] + j["age"], abs=1e-5)
        assert j["size"] == pytest.approx(100 * j["size_factor"], abs=1e-3)
    assert by["c"]["size"] > by["a"]["size"]
    # vision holds all 16 GPUs: its fair-share points are below nlp's
    assert by["a"]["fairshare"] < by["v"]["fairshare"]
    assert prio["weights"] == {"fairshare": 20.0, "size": 100.0, "age": 0.0}
    assert get(api, "/api/v1/priorities?team=nlp")["jobs"][0]["name"] == "v"

    queue = get(api, "/api/v1/queue")
    assert [j["name"] for j in queue] == ["big", "v", "b", "c", "a"]
    assert queue[0]["state"] == "admitted" and queue[0]["rank"] is None
    assert queue[0]["elapsed_s"] is not None and queue[0]["replicas"]
    assert [j["rank"] for j in queue[1:]] == [1, 2, 3, 4]
    pend = queue[-1]
    assert pend["pending"]["code"] == "Resources" and "held by big (" in pend["reason"]
    assert pend["eta_s"] is not None and pend["eta_at"] is not None
    assert get(api, "/api/v1/queue?state=pending&team=nlp")[0]["name"] == "v"
    assert len(get(api, "/api/v1/queue?limit=2")) == 2
    # cancel the big one: the next pass starts what the order says, as far as it fits
    api.delete(f"/api/v1/jobs/{big['id']}", headers=auth(api, "vision"))
    assert set(api.tick()) == {v["id"], b["id"], c["id"]}
    assert [j["name"] for j in get(api, "/api/v1/queue")][-1] == "a"
    assert "big" not in [j["name"] for j in get(api, "/api/v1/queue")]
    everything = get(api, "/api/v1/queue?all=true")
    assert everything[-1]["name"] == "big" and everything[-1]["state"] == "cancelled"
    assert [j["name"] for j in get(api, "/api/v1/queue?state=cancelled")] == ["big"]
    assert a["id"] in {j["id"] for j in everything}


def test_shares_show_usage_and_the_fair_share_factor(api):
    used = submit(api, "nlp", spec("used", 8))
    api.tick()
    with api.service.sessions.begin() as s:        # it ran for an hour
        s.execute(update(JobRow).where(JobRow.id == used["id"]).values(
            admitted_at=datetime.now(UTC) - timedelta(hours=1)))
    post(api, f"/api/v1/jobs/{used['id']}/finish", "nlp",
         json={"outcome": "succeeded", "exit_code": 0})
    submit(api, "vision", spec("x", 1))
    submit(api, "nlp", spec("y", 1))
    r = api.put("/api/v1/teams/vision", json={"share": 1, "quota_gpus": 12},
                headers=auth(api, "admin"))
    assert r.status_code == 200, r.text
    shares = {t["name"]: t for t in get(api, "/api/v1/shares")}
    nlp, vision = shares["nlp"], shares["vision"]
    assert nlp["usage_gpu_hours"] == pytest.approx(8, rel=0.01)
    assert (nlp["usage_norm"], vision["usage_norm"]) == (1.0, 0.0)
    assert nlp["share_norm"] == vision["share_norm"] == 0.5
    # 2^(-1/0.5) = 0.25 of fairshare_weight 20; an idle team gets all of it
    assert nlp["fairshare_factor"] == pytest.approx(0.25, abs=1e-3)
    assert nlp["fairshare_points"] == pytest.approx(5, abs=0.02)
    assert (vision["fairshare_factor"], vision["fairshare_points"]) == (1.0, 20.0)
    assert vision["quota_gpus"] == 12 and nlp["pending_jobs"] == 1
    # the same points the scheduler orders by
    prio = {j["team"]: j["fairshare"] for j in get(api, "/api/v1/priorities")["jobs"]}
    assert prio == {"nlp": nlp["fairshare_points"], "vision": vision["fairshare_points"]}


# -- hold, release, update, requeue -----------------------------------------------------
def test_a_held_job_is_never_started_until_released(api):
    job = submit(api, "vision", spec("held", 8))
    held = post(api, "/api/v1/jobs/held/hold")
    assert held["pending"]["code"] == "JobHeldUser"
    assert api.tick() == [] and api.tick() == []       # GPUs are free; it stays held
    why = get(api, "/api/v1/jobs/held/explain")
    assert why["code"] == "JobHeldUser" and "held by team vision" in why["reason"]
    assert get(api, "/api/v1/queue")[0]["pending"]["code"] == "JobHeldUser"
    prio = get(api, "/api/v1/priorities")
    assert prio["jobs"] == [] and prio["not_queued"][0]["code"] == "JobHeldUser"
    post(api, "/api/v1/jobs/held/hold", "nlp", status=403)     # another team's job
    assert post(api, "/api/v1/jobs/held/release")["pending"]["code"] is None
    assert api.tick() == [job["id"]]
    post(api, "/api/v1/jobs/held/hold", status=409)           # not pending any more
    # an admin's hold: only an admin releases it
    other = submit(api, "vision", spec("other", 1))
    assert post(api, f"/api/v1/jobs/{other['id'][:8]}/hold", "admin")["pending"][
        "code"] == "JobHeldAdmin"
    assert post(api, "/api/v1/jobs/other/hold")["pending"]["code"] == "JobHeldAdmin"
    assert "only an admin" in post(api, "/api/v1/jobs/other/release", status=403)["detail"]
    assert api.tick() == []
    post(api, "/api/v1/jobs/other/release", "admin")
    assert api.tick() == [other["id"]]
    kinds = [e["kind"] for e in get(api, "/api/v1/jobs/other/explain")["events"]]
    assert kinds[:4] == ["submitted", "held", "released", "admitted"]


def test_update_priority_reorders_the_queue_and_the_pass(api):
    big = full(api)
    first = submit(api, "vision", spec("first", 16))
    second = submit(api, "vision", spec("second", 16))
    api.tick()                                  # the pass has parsed both specs
    assert [j["name"] for j in get(api, "/api/v1/priorities")["jobs"]] == ["first",
                                                                             "second"]
    job = api.patch("/api/v1/jobs/second", json={"priority": 10},
                    headers=auth(api, "vision"))
    assert job.status_code == 200 and job.json()["priority"] == 10
    assert job.json()["spec"]["priority"] == 10
    assert [j["name"] for j in get(api, "/api/v1/priorities")["jobs"]] == ["second",
                                                                             "first"]
    api.delete(f"/api/v1/jobs/{big['id']}", headers=auth(api, "vision"))
    assert api.tick() == [second["id"]]
    r = api.patch(f"/api/v1/jobs/{first['id']}", json={"priority": 2000000},
                  headers=auth(api, "vision"))
    assert r.status_code == 422
    r = api.patch("/api/v1/jobs/second", json={"priority": 1}, headers=auth(api, "vision"))
    assert r.status_code == 409 and "pending jobs only" in r.json()["detail"]
    r = api.patch("/api/v1/jobs/first", json={}, headers=auth(api, "vision"))
    assert r.status_code == 422


def test_update_time_limit_within_the_policys_bounds(limited):
    api = limited
    job = submit(api, "vision", spec("t", 8, "1h", time_limit="2h"))
    r = api.patch("/api/v1/jobs/t", json={"time_limit": "2d"}, headers=auth(api, "vision"))
    assert r.status_code == 422 and "more than the queue policy allows (1d)" in r.text
    r = api.patch("/api/v1/jobs/t", json={"time_limit": "30m"}, headers=auth(api, "vision"))
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["time_limit"] == "30m"
    assert r.json()["spec"]["expected_runtime"] == "30m"     # it cannot run longer
    assert api.tick() == [job["id"]]
    running = get(api, "/api/v1/jobs/t")
    assert running["time_limit_s"] == 1800
    # the team may lower a live job's limit, only an admin raise it
    r = api.patch("/api/v1/jobs/t", json={"time_limit": "3h"}, headers=auth(api, "vision"))
    assert r.status_code == 403 and "only an admin" in r.json()["detail"]
    r = api.patch("/api/v1/jobs/t", json={"time_limit": "20m"}, headers=auth(api, "vision"))
    assert r.status_code == 200 and r.json()["time_limit_s"] == 1200
    r = api.patch("/api/v1/jobs/t", json={"time_limit": "3h"}, headers=auth(api, "admin"))
    assert r.status_code == 200 and r.json()["time_limit_s"] == 3 * 3600
    r = api.patch("/api/v1/jobs/t", json={"time_limit": "nonsense"},
                  headers=auth(api, "admin"))
    assert r.status_code == 422


def test_requeue_puts_a_running_job_back_under_the_same_id(api):
    job = submit(api, "vision", spec("r", 8))
    post(api, "/api/v1/jobs/r/requeue", status=409)          # pending: nothing to stop
    api.tick()
    post(api, "/api/v1/jobs/r/heartbeat")
    post(api, "/api/v1/jobs/r/requeue", "nlp", status=403)
    stopping = post(api, f"/api/v1/jobs/{job['id'][:5]}/requeue")
    assert stopping["state"] == "preempting" and stopping["preempt_signal"] == "SIGTERM"
    assert stopping["preempt_reason"].startswith("requeued by team vision")
    assert post(api, "/api/v1/jobs/r/heartbeat")["state"] == "preempting"
    back = post(api, "/api/v1/jobs/r/finish", json={"outcome": "preempted", "attempt": 1})
    assert back["state"] == "pending" and back["requeue_reason"] == "requeued"
    assert back["id"] == job["id"] and back["preemptions"] == 0
    assert api.tick() == [job["id"]]
    assert get(api, "/api/v1/jobs/r")["attempt"] == 2
    events = [e["message"] for e in get(api, "/api/v1/jobs/r/explain")["events"]]
    assert any(m.startswith("requeued by team vision: its launcher stopped") for m in events)


# -- drain reasons and the cluster ----------------------------------------------------------
def test_drain_reason_in_the_cluster_and_in_pending_reasons(api):
    r = api.post("/api/v1/hosts/dgx-1/drain", json={"reason": "bad fan"},
                 headers=auth(api, "vision"))
    assert r.status_code == 403
    r = api.post("/api/v1/hosts/dgx-1/drain", json={"reason": "bad fan"},
                 headers=auth(api, "admin"))
    assert r.json() == {"name": "dgx-1", "drained": True, "drain_reason": "bad fan"}
    cluster = get(api, "/api/v1/cluster")
    h1 = cluster["hosts"][0]
    assert (h1["drain_reason"], h1["drained_by"], h1["free_gpus"]) == ("bad fan", "ops", 0)
    assert h1["gpus_unavailable"] == 8 and cluster["gpus_free"] == 8
    assert cluster["drained_hosts"][0]["reason"] == "bad fan"
    # 16 GPUs need the drained host: Unhealthy, naming it and its reason
    whole = submit(api, "vision", spec("whole", 16))
    api.tick()
    why = get(api, f"/api/v1/jobs/{whole['id']}/explain")
    assert why["code"] == "Unhealthy" and "dgx-1 (reason: bad fan)" in why["reason"]
    api.delete(f"/api/v1/jobs/{whole['id']}", headers=auth(api, "vision"))
    # dgx-2 busy: 8 GPUs would fit now only on the drained host
    busy = submit(api, "vision", spec("busy", 8))
    assert api.tick() == [busy["id"]]
    submit(api, "nlp", spec("eight", 8))
    api.tick()
    why = get(api, "/api/v1/jobs/eight/explain", "nlp")
    assert why["code"] == "Resources"
    assert "8 GPUs fit now only on drained hosts dgx-1 (reason: bad fan)" in why["reason"]
    assert why["details"]["drained_hosts"] == {"dgx-1": "bad fan"}
    # resume clears it
    r = api.post("/api/v1/hosts/dgx-1/resume", headers=auth(api, "admin"))
    assert r.json()["drained"] is False
    h1 = get(api, "/api/v1/cluster")["hosts"][0]
    assert (h1["drain_reason"], h1["free_gpus"]) == (None, 8)
    assert len(api.tick()) == 1
    # draining again without a reason
    r = api.post("/api/v1/hosts/dgx-1/drain", headers=auth(api, "admin"))
    assert r.json()["drain_reason"] is None


def test_cluster_allocation_per_host_and_numa_node(api):
    job = submit(api, "vision", {"name": "n", "roles": [{"name": "w", "gpus": 4, "cpus": 16,
                                                         "memory": "64GiB"}]})
    assert api.tick() == [job["id"]]
    (replica,) = get(api, "/api/v1/jobs/n")["replicas"]
    cluster = get(api, "/api/v1/cluster")
    host = next(h for h in cluster["hosts"] if h["name"] == replica["host"])
    assert host["gpus_allocated"] == 4 and host["free_gpus"] == 4
    assert host["cpus_allocated"] == len(replica["cpus"]) >= 16
    assert host["memory_allocated"] == sum(replica["memory_by_numa"].values()) == 64 << 30
    assert host["cpus_total"] > host["cpus_allocated"] and host["memory_total"] > 64 << 30
    numa = {n["node"]: n for n in host["numa"]}
    assert sum(n["gpus_allocated"] for n in numa.values()) == 4
    assert sum(n["cpus_allocated"] for n in numa.values()) == host["cpus_allocated"]
    for node, b in replica["memory_by_numa"].items():
        assert numa[int(node)]["memory_allocated"] == b
    assert sum(len(n["gpus"]) for n in numa.values()) == 8
    assert cluster["cpus_allocated"] == host["cpus_allocated"]
    # an unreachable host's GPUs are never free
    with api.service.sessions.begin() as s:
        old = datetime.now(UTC) - timedelta(hours=1)
        s.execute(update(HostRow).where(HostRow.name == "dgx-2").values(
            registered_at=old, reported_at=old))
    h2 = next(h for h in get(api, "/api/v1/cluster")["hosts"] if h["name"] == "dgx-2")
    assert h2["reachable"] is False and h2["free_gpus"] == 0
    assert h2["gpus_unavailable"] == 8 - h2["gpus_allocated"]


def test_a_hold_committed_during_a_pass_wins(api, monkeypatch):
    """PostgreSQL: the pass reads the pending jobs, a hold commits meanwhile, and the
    pass's admission (guarded by `not held`) writes nothing for that job."""
    if api.service.engine.dialect.name == "sqlite":
        pytest.skip("SQLite passes hold the write lock: a hold waits for the pass")
    from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
    from airflow_gpu.scheduler_core.service.core import Principal
    from airflow_gpu.scheduler_core.service.jobcontrol import hold

    job = submit(api, "vision", spec("racing", 8))
    schedule = Scheduler.schedule

    def held_meanwhile(self, now, explain=False):
        hold(api.service, job["id"], Principal("vision"))
        return schedule(self, now, explain)

    monkeypatch.setattr(Scheduler, "schedule", held_meanwhile)
    assert api.tick() == []
    monkeypatch.setattr(Scheduler, "schedule", schedule)
    got = get(api, "/api/v1/jobs/racing")
    assert got["state"] == "pending" and got["pending"]["code"] == "JobHeldUser"
    assert get(api, "/api/v1/cluster")["gpus_allocated"] == 0
