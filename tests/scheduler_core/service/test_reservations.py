"""Admins' reservations through the real app on SQLite and PostgreSQL: a maintenance
window on 2 of 4 hosts an hour ahead (what fits before it starts there, a longer job goes
elsewhere or waits with ReservedForMaintenance, the hosts drain at its start and resume
at its end), a team reservation (only its team's jobs that ask for it run there, on no
quota), the running jobs a new reservation will stop, and bad input."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.databases import serve

HOSTS = ({"name": "dgx-[1-4]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submit(api, team: str, name: str, gpus: int, runtime: str, **more) -> dict:
    r = api.post("/api/v1/jobs", headers=auth(api, team), json={"spec": {
        "name": name, "roles": [{"name": "w", "gpus": gpus}], "expected_runtime": runtime,
        **more}})
    assert r.status_code == 201, r.text
    return r.json()


def job(api, job_id: str) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}", headers=auth(api, "vision")).json()


def hosts_of(j: dict) -> set[str]:
    return {r["host"] for r in j["replicas"] if r["live"]}


def reserve(api, **body) -> dict:
    r = api.post("/api/v1/reservations", headers=auth(api, "admin"), json=body)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def api(db_url):
    yield from serve(db_url, hosts=HOSTS)


def test_a_maintenance_window_ahead_plans_around_and_drains_its_hosts(api):
    made = reserve(api, name="fw", hosts="dgx-[1-2]", start="now+1h", duration="2h",
                   maint=True)
    assert (made["state"], made["hosts"], made["duration_s"], made["stops"]) == (
        "upcoming", ["dgx-1", "dgx-2"], 7200, [])
    busy = submit(api, "nlp", "busy", 8, "10h")            # takes a host outside it
    api.tick()
    assert hosts_of(job(api, busy["id"])) <= {"dgx-3", "dgx-4"}
    short = [submit(api, "vision", "short", 8, "30m")]
    long = submit(api, "vision", "long", 8, "3h")
    longer = submit(api, "vision", "longer", 8, "3h")
    api.tick()
    # what ends before the window starts runs on its hosts, and yields at its start
    for j in short:
        got = job(api, j["id"])
        assert got["state"] == "admitted" and hosts_of(got) <= {"dgx-1", "dgx-2"}, got
        assert got["yield_reservation"] == "fw" and got["yield_at"]
    # a longer one goes to the host left outside it; the next one, which would fit now
    # on the window's last free host, waits, naming the window
    assert hosts_of(job(api, long["id"])) <= {"dgx-3", "dgx-4"}
    waiting = job(api, longer["id"])
    assert waiting["state"] == "pending"
    assert waiting["pending"]["code"] == "ReservedForMaintenance", waiting["pending"]
    assert "maintenance reservation 'fw'" in waiting["pending"]["reason"]
    assert waiting["pending"]["details"]["reservation"] == "fw"

    # the window moves to now (the admin's update): the hosts drain, the short jobs are
    # told to stop, and when it ends the hosts come back by themselves
    r = api.patch("/api/v1/reservations/fw", headers=auth(api, "admin"),
                  json={"start": "now", "duration": "3s"})
    assert r.status_code == 200, r.text
    assert {s["name"] for s in r.json()["stops"]} == {"short"}
    api.tick()
    hosts = {h["name"]: h for h in api.get("/api/v1/cluster",
                                           headers=auth(api, "nlp")).json()["hosts"]}
    for h in ("dgx-1", "dgx-2"):
        assert hosts[h]["drained"] and "maintenance reservation fw" in hosts[h]["drain_reason"]
    assert not hosts["dgx-3"]["drained"]
    api.app.state.loop.check_leases()             # yields are acted on by lease checks
    for j in short:
        assert job(api, j["id"])["state"] == "preempting"
    time.sleep(3.2)
    api.tick()
    hosts = {h["name"]: h for h in api.get("/api/v1/cluster",
                                           headers=auth(api, "nlp")).json()["hosts"]}
    assert not any(hosts[h]["drained"] for h in ("dgx-1", "dgx-2")), hosts
    events = api.get(f"/api/v1/jobs/{short[0]['id']}/explain",
                     headers=auth(api, "vision")).json()["events"]
    assert any(e["kind"] == "reservation" and "maintenance reservation fw" in e["message"]
               for e in events), events


def test_a_team_reservation_runs_only_its_teams_jobs_that_ask_for_it(api):
    reserve(api, name="vis", gpus=16, gpu_model="A100", start="now", duration="2h",
            teams=["vision"])
    listed = api.get("/api/v1/reservations", headers=auth(api, "nlp")).json()
    (r,) = listed
    assert (r["state"], len(r["hosts"]), r["teams"]) == ("active", 2, ["vision"])
    inside = submit(api, "vision", "in", 8, "1h", reservation="vis")
    r_wide = api.post("/api/v1/jobs", headers=auth(api, "vision"), json={"spec": {
        "name": "wide", "roles": [{"name": "w", "replicas": 2, "gpus": 8}],
        "expected_runtime": "1h", "reservation": "vis"}})
    assert r_wide.status_code == 201, r_wide.text
    wide = r_wide.json()
    outside = [submit(api, "nlp", f"other-{i}", 8, "30m") for i in range(3)]
    api.tick()
    got = job(api, inside["id"])
    assert got["state"] == "admitted" and hosts_of(got) <= set(r["hosts"])
    assert got["deadline_at"]         # stopped at the reservation's end
    full = job(api, wide["id"])["pending"]    # half of it is taken: it says by whom
    assert full["code"] == "Reservation" and "is full: held by in (" in full["reason"]
    placed = [job(api, j["id"]) for j in outside]
    assert sum(j["state"] == "admitted" for j in placed) == 2
    assert all(hosts_of(j).isdisjoint(r["hosts"]) for j in placed)
    (waits,) = [j for j in placed if j["state"] == "pending"]
    assert waits["pending"]["code"] == "Reservation", waits["pending"]

    # another team may not ask for it; a job that cannot fit it is refused at submit
    r2 = api.post("/api/v1/jobs", headers=auth(api, "nlp"), json={"spec": {
        "name": "x", "roles": [{"name": "w", "gpus": 1}], "reservation": "vis"}})
    assert r2.status_code == 422 and "for team vision, not 'nlp'" in r2.text
    r3 = api.post("/api/v1/jobs", headers=auth(api, "vision"), json={"spec": {
        "name": "y", "roles": [{"name": "w", "replicas": 3, "gpus": 8}],
        "reservation": "vis"}})
    assert r3.status_code == 422 and "cannot hold it" in r3.text
    r4 = api.post("/api/v1/jobs", headers=auth(api, "vision"), json={"spec": {
        "name": "too-long", "roles": [{"name": "w", "gpus": 8}], "expected_runtime": "3h",
        "reservation": "vis"}})      # longer than the reservation: refused, not left waiting
    assert r4.status_code == 422 and "expected_runtime: 3h would end after" in r4.text

    # deleted, the jobs waiting for it are cancelled
    assert api.delete("/api/v1/reservations/vis", headers=auth(api, "admin")).status_code == 200
    api.tick()
    gone = job(api, wide["id"])
    assert gone["state"] == "cancelled", gone


def test_a_new_reservation_names_the_running_jobs_it_will_stop(api):
    running = submit(api, "nlp", "train", 8, "6h")
    api.tick()
    host = hosts_of(job(api, running["id"])).pop()
    made = reserve(api, name="swap", hosts=host, start="now+1h", duration="1h", maint=True)
    (stop,) = made["stops"]
    assert (stop["name"], stop["team"]) == ("train", "nlp")
    got = job(api, running["id"])
    assert got["yield_reservation"] == "swap"
    yield_at = datetime.fromisoformat(got["yield_at"]).replace(tzinfo=UTC)
    assert abs((yield_at - datetime.fromisoformat(made["start"])).total_seconds()) < 1
    assert api.delete("/api/v1/reservations/swap", headers=auth(api, "admin")).status_code == 200
    assert job(api, running["id"])["yield_reservation"] is None


@pytest.mark.parametrize("body, status, says", [
    ({"name": "a", "hosts": "dgx-9", "duration": "1h", "maint": True}, 422,
     "hosts: 'dgx-9' is not a host"),
    ({"name": "a", "hosts": "dgx-1", "start": "2020-01-01T00:00", "duration": "1h",
      "maint": True}, 422, "is in the past"),
    ({"name": "a", "hosts": "dgx-1", "duration": "1h", "teams": ["nobody"]}, 422,
     "teams: 'nobody' is no team"),
    ({"name": "a", "hosts": "dgx-1", "duration": "1h"}, 422, "names the teams"),
    ({"name": "a", "hosts": "dgx-1", "maint": True}, 422, "either an end"),
    ({"name": "a", "hosts": "dgx-1", "start": "tomorrow", "duration": "1h", "maint": True},
     422, "start: 'tomorrow' is no time"),
    ({"name": "a", "gpus": 100, "duration": "1h", "maint": True}, 422, "fewer than the 100"),
    ({"name": "a", "hosts": "dgx-1", "gpus": 8, "duration": "1h", "maint": True}, 422,
     "not both"),
])
def test_bad_reservations_are_refused_naming_the_field(api, body, status, says):
    r = api.post("/api/v1/reservations", headers=auth(api, "admin"), json=body)
    assert r.status_code == status and says in r.text, r.text
    assert api.get("/api/v1/reservations", headers=auth(api, "admin")).json() == []


def test_overlaps_and_rights(api):
    reserve(api, name="a", hosts="dgx-[1-2]", start="now+1h", duration="2h", maint=True)
    r = api.post("/api/v1/reservations", headers=auth(api, "admin"), json={
        "name": "b", "hosts": "dgx-2", "start": "now+2h", "duration": "1h", "maint": True})
    assert r.status_code == 422 and "in reservation 'a'" in r.text
    later = (datetime.now(UTC) + timedelta(hours=3, minutes=1)).isoformat()
    reserve(api, name="b", hosts="dgx-2", start=later, duration="1h", maint=True)
    r = api.post("/api/v1/reservations", headers=auth(api, "vision"), json={
        "name": "c", "hosts": "dgx-3", "duration": "1h", "maint": True})
    assert r.status_code == 403
    r = api.post("/api/v1/reservations", headers=auth(api, "admin"), json={
        "name": "a", "hosts": "dgx-3", "duration": "1h", "maint": True})
    assert r.status_code == 409


def test_simulate_with_the_same_window_decides_as_the_service(api, tmp_path):
    """The service and `simulate` drive one engine: the same jobs and the same window
    give the same placements and reasons; the replay then keeps the window's hosts empty
    through it and uses them again after it."""
    from airflow_gpu.scheduler_core.jobspec import JobSpec
    from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
    from airflow_gpu.scheduler_core.simulation.trace import TraceJob
    from airflow_gpu.scheduler_core.simulation.windowfile import load_windows

    asks = [("busy", "10h"), ("short", "30m"), ("long", "3h"), ("longer", "3h")]
    reserve(api, name="fw", hosts="dgx-[1-2]", start="now+1h", duration="2h", maint=True)
    ids = {name: submit(api, "vision", name, 8, runtime)["id"] for name, runtime in asks}
    api.tick()
    served = {}
    for name, job_id in ids.items():
        j = job(api, job_id)
        served[name] = (sorted(hosts_of(j)) if j["state"] == "admitted"
                        else j["pending"]["code"])

    def spec_of(t: TraceJob) -> JobSpec:
        return JobSpec.model_validate({"name": t.job_id, "team": "vision",
                                       "roles": [{"name": "w", "gpus": 8}],
                                       "expected_runtime": dict(asks)[t.job_id]})

    path = tmp_path / "windows.yaml"
    path.write_text("reservations:\n  - {name: fw, hosts: 'dgx-[1-2]', start: 1h, "
                    "duration: 2h, maint: true}\n")
    cluster = api.service.cluster
    windows = load_windows(str(path), cluster)
    hours = {"10h": 10, "30m": 0.5, "3h": 3}
    trace = [TraceJob(name, 0.0, hours[rt] * 3600, 8) for name, rt in asks]
    passes = []
    simulate(cluster, trace, SimOptions(spec_of=spec_of, windows=windows),
             observe=lambda s, r: passes.append((r.now, {
                 j.name: sorted({a.host.name for a in p.allocations}) for j, p in r.started},
                 {n: why.code for n, why in r.pending.items()}, {
                     n: {a.host.name for a in s.state.allocations[n]} for n in s.running})))
    now, started, _, _ = passes[0]
    replayed = {name: started.get(name) for name, _ in asks}
    # the first pass is not explained in the replay: its waiting job's code, from plan's
    from airflow_gpu.scheduler_core.engine.state import ClusterState
    from airflow_gpu.scheduler_core.policy.planner import plan

    planned = plan(ClusterState(cluster), [spec_of(t) for t in trace], windows=windows)
    for spec, why in planned.pending:
        replayed[spec.name] = why.code
    assert replayed == served, (replayed, served)
    # the smaller jobs go first: the short one on the window's hosts (it ends before
    # it), the 3-hour ones outside it; the 10-hour one fits only on the window's last
    # free host and waits for it
    assert served == {"short": ["dgx-1"], "long": ["dgx-3"], "longer": ["dgx-4"],
                      "busy": "ReservedForMaintenance"}
    # through the window nothing runs on its hosts; after it they are used again
    inside = [(t, held) for t, _, _, held in passes if 3600 <= t < 3 * 3600
              and any(h & {"dgx-1", "dgx-2"} for h in held.values())]
    assert inside == []
    after = [names for t, names, _, _ in passes if t >= 3 * 3600
             and any({"dgx-1", "dgx-2"} & set(h) for h in names.values())]
    assert after, passes
