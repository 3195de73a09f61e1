"""Jobs are named by their 8-character id (and their name) wherever a person reads them, as
queue does: a preemption's `preempt_reason` and events, the requeue's event, the task
log's preemption line, `run`'s pending line and `acct`'s job column, through the real
service and store (SQLite and PostgreSQL) and the CLI's own renderers. The whole ids stay
in the API's id fields, `--json` and `--csv`."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from airflow_gpu.cli.commands import acct_command
from airflow_gpu.cli.commands.run_output import pending_line
from airflow_gpu.launch.lease import Lease
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from tests.databases import serve
from tests.scheduler_core.api.test_api import auth, spec, submit
from tests.scheduler_core.service.test_reclaim_and_requeue import POLICY, _borrowing, job


@pytest.fixture
def api(db_url):
    yield from serve(db_url, PolicyConfig.model_validate(POLICY))


def events(api, job_id: str, team: str = "vision") -> dict[str, str]:
    got = api.get(f"/api/v1/jobs/{job_id}/explain", headers=auth(api, team)).json()
    return {e["kind"]: e["message"] for e in got["events"]}


def rendered(table) -> str:
    out = io.StringIO()
    Console(file=out, width=400).print(table)
    return out.getvalue()


def test_a_preemption_names_its_jobs_by_name_and_short_id(api, caplog):
    _, v2 = _borrowing(api)
    n1 = submit(api, "nlp", spec("n1", 8)).json()
    assert api.tick() == []
    v2 = job(api, v2["id"])
    ids = (v2["id"], n1["id"])
    said = v2["preempt_reason"]
    assert said.startswith(f"preempted by job n1 ({n1['id'][:8]}) (reclaim: "), said
    assert v2["preempted_by"] == n1["id"]               # the API's field keeps the id
    told = [*events(api, v2["id"]).values(), *events(api, n1["id"], "nlp").values()]
    assert events(api, n1["id"], "nlp")["preempting"].startswith(
        f"preempts job v2 ({v2['id'][:8]}) (reclaim")
    # the task log's line, from the heartbeat's job
    with caplog.at_level(logging.WARNING):
        why = Lease().preempted(v2, logging.getLogger("task"))
    assert str(why).startswith(f"preempted by job n1 ({n1['id'][:8]}) (reclaim: ")
    assert "SIGTERM to all replicas" in caplog.text
    # run's line while the victim waits again, after its launcher stopped it
    r = api.post(f"/api/v1/jobs/{v2['id']}/finish", headers=auth(api, "vision"),
                 json={"outcome": "preempted", "attempt": v2["attempt"]})
    assert r.status_code == 200, r.text
    assert events(api, v2["id"])["requeued"].startswith(
        f"preempted by job n1 ({n1['id'][:8]}): its launcher stopped the replicas")
    line, _ = pending_line(job(api, v2["id"]))
    assert line.startswith(f"airflow-gpu run: job {v2['id'][:8]} pending: ")
    for text in (said, *told, str(why), caplog.text, line,
                 events(api, v2["id"])["requeued"]):
        assert not any(i in text for i in ids), text


def test_acct_s_table_names_jobs_by_short_id(api):
    _borrowing(api)
    data = api.get("/api/v1/accounting", params={"by": "job"},
                   headers=auth(api, "vision")).json()
    table = rendered(acct_command.table(data))
    for r in data["rows"]:
        assert r["job"][:8] in table and r["job"] not in table


def test_update_and_hold_answer_with_the_reason_naming_jobs_by_short_id(api):
    big = submit(api, "vision", spec("big", 16)).json()
    assert api.tick() == [big["id"]]
    small = submit(api, "vision", spec("small", 8)).json()
    api.tick()
    assert big["id"] in api.service.get(small["id"]).reason     # stored by id
    r = api.patch(f"/api/v1/jobs/{small['id']}", headers=auth(api, "vision"),
                  json={"priority": 3})
    assert r.status_code == 200, r.text
    reason = r.json()["pending"]["reason"]
    assert f"big ({big['id'][:8]})" in reason and big["id"] not in reason, reason
    r = api.post("/api/v1/jobs/update", headers=auth(api, "vision"),
                 json={"jobs": ["small"], "priority": 4})
    reason = r.json()["jobs"][0]["pending"]["reason"]
    assert f"big ({big['id'][:8]})" in reason and big["id"] not in reason, reason
