"""Cancelling by filters (scancel -u/-t/-n) and draining host ranges, through the real API
on SQLite and PostgreSQL: a team token matches only its own team's jobs; a dry run
cancels nothing; a range with an unknown host drains none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.databases import serve


def auth(api, who: str = "vision") -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def submit(api, name: str, who: str, gpus: int = 1) -> dict:
    r = api.post("/api/v1/jobs", headers=auth(api, who),
                 json={"spec": {"name": name, "roles": [{"name": "w", "gpus": gpus}]}})
    assert r.status_code == 201, r.text
    return r.json()


def cancel(api, who: str = "vision", status: int = 200, **body):
    r = api.post("/api/v1/jobs/cancel", json=body, headers=auth(api, who))
    assert r.status_code == status, r.text
    return r.json()


def test_a_team_token_only_ever_matches_its_own_teams_jobs(api):
    running = submit(api, "train", "vision", 8)
    api.tick()
    mine = [submit(api, "train", "vision", 8), submit(api, "eval", "vision", 8)]
    nlp = [submit(api, "train", "nlp", 8), submit(api, "eval", "nlp", 8)]
    # by state: only vision's pending jobs, though nlp's pend too
    shown = cancel(api, state="pending", dry_run=True)
    assert shown["matched"] == [j["id"] for j in mine] and shown["cancelled"] == []
    assert {j["team"] for j in shown["jobs"]} == {"vision"}
    # by name: only vision's; the live one too (no state given)
    got = cancel(api, name="train")
    assert got["cancelled"] == [running["id"], mine[0]["id"]]
    # another team by filter, or by reference: 403, nothing cancelled
    assert "cancels only that team's jobs" in cancel(api, team="nlp", status=403)["detail"]
    cancel(api, jobs=[nlp[0]["id"][:8]], status=403)
    # an admin's token matches any team, filters combined (all must hold)
    got = cancel(api, "admin", team="nlp", name="eval", state="pending")
    assert got["cancelled"] == [nlp[1]["id"]]
    left = {j["name"] + "/" + j["team"]: j["state"]
            for j in api.get("/api/v1/jobs", headers=auth(api)).json()}
    assert left == {"train/vision": "cancelled", "eval/vision": "pending",
                    "train/nlp": "pending", "eval/nlp": "cancelled"}


def test_a_dry_runs_as_of_keeps_jobs_submitted_since_out(api):
    first = submit(api, "a", "vision")
    shown = cancel(api, state="pending", dry_run=True)
    later = submit(api, "b", "vision")
    got = cancel(api, state="pending", submitted_before=shown["as_of"])
    assert got["cancelled"] == [first["id"]]
    assert api.get(f"/api/v1/jobs/{later['id']}", headers=auth(api)).json()["state"] == \
        "pending"
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert cancel(api, state="pending", submitted_before=past)["count"] == 0


@pytest.fixture
def ranged(db_url):
    """Four A100 hosts and an H100 host, named as a cluster file's ranges make them."""
    yield from serve(db_url, hosts=(
        {"name": "dgx-a-[01-04]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},
        {"name": "dgx-h-05", "model": "dgx-h100", "rack": "r1", "switch": "s1"}))


def test_drain_and_resume_take_host_ranges_all_or_none(ranged):
    api = ranged

    def post(path, who="admin", status=200, **body):
        r = api.post(path, json=body, headers=auth(api, who))
        assert r.status_code == status, r.text
        return r.json()

    def drained():
        hosts = api.get("/api/v1/cluster", headers=auth(api)).json()["hosts"]
        return sorted(h["name"] for h in hosts if h["drained"])

    got = post("/api/v1/hosts/drain", hosts="dgx-a-[01-03],dgx-h-05", reason="rack work")
    assert [(h["name"], h["drain_reason"]) for h in got["hosts"]] == [
        ("dgx-a-01", "rack work"), ("dgx-a-02", "rack work"), ("dgx-a-03", "rack work"),
        ("dgx-h-05", "rack work")]
    said = post("/api/v1/hosts/resume", hosts="dgx-a-[01-02],dgx-z-09", status=404)["detail"]
    assert said.startswith("hosts: dgx-z-09 is not in the cluster; nothing was resumed")
    assert drained() == ["dgx-a-01", "dgx-a-02", "dgx-a-03", "dgx-h-05"]
    got = post("/api/v1/hosts/resume", hosts="dgx-a-[01-02]")
    assert [h["drained"] for h in got["hosts"]] == [False, False]
    assert drained() == ["dgx-a-03", "dgx-h-05"]
    assert "hosts:" in post("/api/v1/hosts/drain", hosts="dgx-[", status=422)["detail"]
    post("/api/v1/hosts/drain", who="vision", hosts="dgx-a-04", status=403)


def test_by_user_cancels_that_users_jobs_only(api):
    from airflow_gpu.scheduler_core.service.auth import create_token

    api.tokens["alice"] = create_token(api.service.sessions, "vision", user="alice")
    hers = [submit(api, f"a{i}", "alice") for i in range(2)]
    others = [submit(api, "b0", "vision"), submit(api, "n0", "nlp")]
    got = cancel(api, who="admin", user="alice")
    assert sorted(got["cancelled"]) == sorted(j["id"] for j in hers)
    for j in others:
        r = api.get(f"/api/v1/jobs/{j['id']}", headers=auth(api, "admin")).json()
        assert r["state"] == "pending"
