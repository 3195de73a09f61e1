"""Submitting several jobs all or nothing (POST /api/v1/jobs/batch, `airflow-gpu submit`
of a multi-job file) and idempotency keys reused with another spec (409), through the real
app on SQLite and PostgreSQL, and the CLI against a server process of its own."""

from __future__ import annotations

import json
import threading

import pytest
import yaml

from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.service import batch
from airflow_gpu.scheduler_core.service.core import Principal
from airflow_gpu.scheduler_core.store.models import JobRow
from tests.cli.test_cli_e2e import cli, server  # noqa: F401  (the server fixture)


def spec(name: str, gpus: int = 1, team: str | None = None, **more) -> dict:
    out = {"name": name, "expected_runtime": "1h", "roles": [{"name": "w", "gpus": gpus}],
           **more}
    if team:
        out["team"] = team
    return out


def bearer(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def post_batch(api, who: str, specs: list[dict], keys: list[str | None] | None = None):
    keys = keys or [None] * len(specs)
    body = {"jobs": [{"spec": s, "idempotency_key": k} for s, k in zip(specs, keys,
                                                                          strict=True)]}
    return api.post("/api/v1/jobs/batch", json=body, headers=bearer(api, who))


def job_ids(api) -> list[str]:
    return [j["id"] for j in api.get("/api/v1/jobs", headers=bearer(api, "admin")).json()]


def test_a_batch_is_created_whole_in_its_order(api):
    r = post_batch(api, "vision", [spec("a"), spec("b", 8), spec("c", 2)])
    assert r.status_code == 201, r.text
    jobs = r.json()
    assert [j["name"] for j in jobs] == ["a", "b", "c"]
    assert {j["team"] for j in jobs} == {"vision"} and {j["state"] for j in jobs} == {
        "pending"}
    assert job_ids(api) == [j["id"] for j in jobs]
    assert api.tick()            # the pass sees them all


def test_another_teams_job_in_a_batch_creates_nothing(api):
    r = post_batch(api, "vision", [spec("a"), spec("b", team="nlp"), spec("c")])
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == ("jobs[1] (name 'b'): team: your token is for team "
                                  "'vision', not 'nlp'")
    assert job_ids(api) == []
    # an admin submits for several teams at once
    r = post_batch(api, "admin", [spec("a", team="vision"), spec("b", team="nlp")])
    assert r.status_code == 201 and [j["team"] for j in r.json()] == ["vision", "nlp"]


@pytest.mark.parametrize("bad, says", [
    ({**spec("huge"), "roles": [{"name": "w", "replicas": 3, "gpus": 8}]},
     "does not fit even on the empty cluster"),
    (spec("typo", job_class="trainnig"), "job_class: unknown class 'trainnig'"),
], ids=["never-fits", "unknown-class"])
def test_a_job_that_cannot_run_refuses_the_batch(api, bad, says):
    r = post_batch(api, "vision", [spec("a"), spec("b"), bad])
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"jobs[2] (name {bad['name']!r}): ") and says in detail
    assert "job 'huge'" not in detail and "job 'typo'" not in detail   # named once
    assert job_ids(api) == []


def test_bad_bodies_are_422_naming_the_job(api):
    assert post_batch(api, "vision", []).status_code == 422
    r = post_batch(api, "vision", [spec("a"), {"name": "b", "roles": [{"name": "w",
                                                                       "gpuz": 1}]}])
    assert r.status_code == 422
    assert ["body", "jobs", 1, "spec", "roles", 0, "gpuz"] in [d["loc"] for d in
                                                               r.json()["detail"]]
    r = post_batch(api, "vision", [spec(f"j{i}") for i in range(batch.MAX_JOBS + 1)])
    assert r.status_code == 422 and "1000" in r.text
    r = api.post("/api/v1/jobs/batch", json={"jobs": [{"spec": spec("a")}]})
    assert r.status_code == 401
    assert job_ids(api) == []


def test_keys_in_a_batch_are_idempotent(api):
    specs, keys = [spec("a"), spec("b"), spec("c")], ["ka", "kb", None]
    first = post_batch(api, "vision", specs, keys)
    assert first.status_code == 201
    ids = [j["id"] for j in first.json()]
    # the same keyed jobs again: the jobs they created, nothing new (200)
    again = post_batch(api, "vision", specs[:2], keys[:2])
    assert again.status_code == 200 and [j["id"] for j in again.json()] == ids[:2]
    # one seen, one new: 201, the seen one is the job it created
    mixed = post_batch(api, "vision", [spec("b"), spec("d")], ["kb", "kd"])
    assert mixed.status_code == 201
    assert mixed.json()[0]["id"] == ids[1] and mixed.json()[1]["id"] not in ids
    assert len(job_ids(api)) == 4
    # a key the single submit used is the same job in a batch, and the other way round
    one = api.post("/api/v1/jobs", json={"spec": spec("e"), "idempotency_key": "ke"},
                   headers=bearer(api, "vision")).json()
    assert post_batch(api, "vision", [spec("e")], ["ke"]).json()[0]["id"] == one["id"]
    r = api.post("/api/v1/jobs", json={"spec": spec("a"), "idempotency_key": "ka"},
                 headers=bearer(api, "vision"))
    assert r.status_code == 200 and r.json()["id"] == ids[0]
    # keys are per team: nlp's "ka" is a job of its own
    assert post_batch(api, "nlp", [spec("a")], ["ka"]).status_code == 201


def test_a_key_twice_in_one_batch_is_refused(api):
    r = post_batch(api, "vision", [spec("a"), spec("b")], ["k", "k"])
    assert r.status_code == 422
    assert r.json()["detail"].startswith("jobs[1] (name 'b'): idempotency_key 'k' is also "
                                         "the key of jobs[0] (name 'a')")
    assert job_ids(api) == []


def test_a_key_reused_with_another_spec_is_a_conflict(api):
    def submit(body: dict, key: str = "k1"):
        return api.post("/api/v1/jobs", json={"spec": body, "idempotency_key": key},
                        headers=bearer(api, "vision"))

    first = submit(spec("a", 1)).json()
    r = submit(spec("a", 2))
    assert r.status_code == 409
    assert r.json()["detail"] == (f"idempotency_key 'k1' was used for job {first['id']} "
                                  "with another spec; use a new key")
    # the same job written otherwise (a default given, the team named, keys reordered)
    same = {"roles": [{"gpus": 1, "name": "w"}], "name": "a", "priority": 0,
            "expected_runtime": 3600, "team": "vision"}
    r = submit(same)
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    # the spec submitted counts, not the job's now (its priority changed since, say)
    with api.service.sessions.begin() as s:
        row = s.get(JobRow, first["id"])
        row.spec, row.priority = {**row.spec, "priority": 50}, 50
    r = submit(spec("a", 1))
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    # the header key is the same key
    r = api.post("/api/v1/jobs", json={"spec": spec("a", 4)},
                 headers={**bearer(api, "vision"), "Idempotency-Key": "k1"})
    assert r.status_code == 409
    # in a batch: 409 naming the job, and nothing of the batch is created
    r = post_batch(api, "vision", [spec("new"), spec("a", 2)], ["k2", "k1"])
    assert r.status_code == 409
    assert r.json()["detail"] == (f"jobs[1] (name 'a'): idempotency_key 'k1' was used for "
                                  f"job {first['id']} with another spec; use a new key")
    assert job_ids(api) == [first["id"]]


def test_concurrent_batches_with_the_same_keys_create_each_job_once(api):
    """Two clients racing with the same keys (a retry overtaking its first try): one
    set of jobs, each answers it."""
    service = api.service
    specs = [JobSpec.model_validate(spec(f"j{i}")) for i in range(20)]
    keys = [f"race-{i}" for i in range(20)]
    who = Principal("vision")
    answers, errors = [], []

    def go():
        try:
            answers.append([r.id for r in batch.submit_batch(service, specs, who, keys)[0]])
        except Exception as exc:      # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({tuple(a) for a in answers}) == 1
    assert sorted(job_ids(api)) == sorted(answers[0])


# -- the CLI against a server process -------------------------------------------------------
def test_submit_is_all_or_nothing_from_the_cli(server, tmp_path):  # noqa: F811
    db = server["db"]
    token = cli("token", "create", "--team", "vision", "--db", db).stdout.strip()
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": token}

    # a 403 in the middle of the file: nothing created, nothing printed, exit 1
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump({"jobs": [spec("a"), spec("b", team="nlp"),
                                              spec("c")]}))
    out = cli("submit", str(mixed), env=env)
    assert out.returncode == 1, out.stderr
    assert out.stdout == ""
    assert "403" in out.stderr and "jobs[1] (name 'b')" in out.stderr
    assert f"none of the 3 jobs of {mixed} was submitted" in out.stderr
    assert json.loads(cli("queue", "--json", env=env).stdout) == []

    # a typo: refused here with plan's message and exit code, before anything is sent
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"jobs": [spec("a"), {"name": "b", "roles": [
        {"name": "w", "replicaz": 2, "gpus": 1}]}]}))
    out = cli("submit", str(typo), env=env)
    plan = cli("plan", "--cluster", "example", "--jobs", str(typo))
    assert (out.returncode, plan.returncode) == (2, 2)
    assert out.stdout == "" and "did you mean 'replicas'" in out.stderr
    assert out.stderr == plan.stderr
    klass = tmp_path / "class.yaml"
    klass.write_text(yaml.safe_dump({"jobs": [spec("a", job_class="trainnig")]}))
    out = cli("submit", str(klass), env=env)
    plan = cli("plan", "--cluster", "example", "--jobs", str(klass))
    assert out.returncode == 2 and out.stderr == plan.stderr and "job_class" in out.stderr
    assert json.loads(cli("queue", "--json", env=env).stdout) == []

    # a good file: every id, in the file's order
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"jobs": [spec("a"), spec("b"), spec("c")]}))
    out = cli("submit", str(good), env=env)
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    names = {j["id"]: j["name"] for j in json.loads(cli("queue", "--json", env=env).stdout)}
    assert len(names) == 3 and [names[i] for i in ids] == ["a", "b", "c"]
    out = cli("submit", str(good), "--json", env=env)
    assert [j["name"] for j in json.loads(out.stdout)] == ["a", "b", "c"]
