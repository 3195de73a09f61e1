"""What an agent token may steer, through the real app on SQLite and PostgreSQL: it adds a
host the cluster file does not list only where an admin allowed it (--allow-new-hosts),
else 403 naming the host, the token and the fix; admin tokens add any host; a host's
launch addresses (docker_url, address) do not change while jobs run there (409 and an
event), and do change on an idle host (with an event)."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import select, text

from airflow_gpu.scheduler_core.engine.topology import load_topology
from airflow_gpu.scheduler_core.service import auth
from airflow_gpu.scheduler_core.store.db import make_engine, sessions, upgrade
from airflow_gpu.scheduler_core.store.models import EventRow, HostRow
from tests.cli.test_cli_e2e import cli, server  # noqa: F401  (the server fixture)
from tests.databases import serve

ONE = ({"name": "dgx-1", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


@pytest.fixture
def one(db_url):
    """The app on a cluster file of one host, dgx-1."""
    yield from serve(db_url, hosts=ONE)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def agent(api, *hosts: str, new: tuple[str, ...] = ()) -> tuple[str, int]:
    """An agent token for `hosts` (allowed to add `new`), and its id."""
    more = {"new_hosts": list(new)} if new else {}
    token, row = auth.issue_token(api.service.sessions, None, hosts=list(hosts), **more)
    return token, row.id


def register(api, name: str, token: str, model: str = "dgx-a100", **extra):
    body = {"topology": load_topology(model).document(), **extra}
    return api.put(f"/api/v1/hosts/{name}", json=body, headers=bearer(token))


def submit(api, name: str, gpus: int, who: str) -> str:
    spec = {"name": name, "expected_runtime": "1h",
            "roles": [{"name": "w", "replicas": 1, "gpus": gpus}]}
    r = api.post("/api/v1/jobs", json={"spec": spec}, headers=bearer(api.tokens[who]))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job(api, job_id: str) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}", headers=bearer(api.tokens["admin"])).json()


def hosts(api) -> dict[str, dict]:
    view = api.get("/api/v1/cluster", headers=bearer(api.tokens["admin"])).json()
    return {h["name"]: h for h in view["hosts"]}


def host_events(api, name: str) -> list[str]:
    with api.service.sessions() as s:
        return list(s.scalars(select(EventRow.message).where(EventRow.host == name)
                              .order_by(EventRow.id)))


def test_a_pattern_token_cannot_add_a_host_and_draw_other_teams_jobs(api):
    """The attack: a 'dgx-*' agent token registers dgx-9 (no such host in the cluster file)
    with its own docker_url while the file's hosts are full; nlp's 8-GPU job must not go
    there."""
    token, tid = agent(api, "dgx-*")
    for name in ("a", "b"):
        submit(api, name, 8, "vision")
    assert len(api.tick()) == 2                           # dgx-1 and dgx-2 are full
    r = register(api, "dgx-9", token, docker_url="tcp://elsewhere:2376")
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    for part in ("host dgx-9 is not in the cluster file", f"agent token {tid}",
                 "hosts dgx-*", "add dgx-9 to the cluster file",
                 "airflow-gpu token create --agent --host dgx-9 --allow-new-hosts dgx-9"):
        assert part in detail, (part, detail)
    theirs = submit(api, "theirs", 8, "nlp")
    assert theirs not in api.tick()
    assert job(api, theirs)["state"] == "pending"
    assert set(hosts(api)) == {"dgx-1", "dgx-2"}
    with api.service.sessions() as s:
        assert s.get(HostRow, "dgx-9") is None
    # the file's hosts it serves it still registers
    assert register(api, "dgx-2", token).status_code == 200


def test_an_allowed_pattern_adds_hosts_and_only_those(api):
    made = api.post("/api/v1/tokens", headers=bearer(api.tokens["admin"]),
                    json={"role": "agent", "hosts": ["dgx-*"], "allow_new_hosts": ["dgx-9*"]})
    assert made.status_code == 201, made.text
    assert made.json()["allow_new_hosts"] == ["dgx-9*"]
    token = made.json()["token"]
    r = register(api, "dgx-90", token, rack="r9", docker_url="tcp://dgx-90:2376")
    assert r.status_code == 200, r.text
    assert r.json()["docker_url"] == "tcp://dgx-90:2376"
    assert "dgx-90" in hosts(api)
    r = register(api, "dgx-80", token)
    assert r.status_code == 403, r.text
    assert "may add only hosts matching dgx-9*" in r.json()["detail"]
    assert register(api, "other-90", token).status_code == 403       # not one of its hosts
    listed = api.get("/api/v1/tokens", headers=bearer(api.tokens["admin"])).json()
    assert [t["allow_new_hosts"] for t in listed if t["role"] == "agent"] == [["dgx-9*"]]
    # a registered host is in the cluster: a token that serves it registers it again ...
    plain, _ = agent(api, "dgx-*")
    assert register(api, "dgx-90", plain, docker_url="tcp://dgx-90:2376").status_code == 200
    # ... until its registration is removed
    gone = api.delete("/api/v1/hosts/dgx-90", headers=bearer(api.tokens["admin"]))
    assert gone.status_code == 204, gone.text
    assert register(api, "dgx-90", plain).status_code == 403
    # only agent tokens take it
    r = api.post("/api/v1/tokens", headers=bearer(api.tokens["admin"]),
                 json={"team": "vision", "allow_new_hosts": ["dgx-9*"]})
    assert r.status_code == 422 and "allow_new_hosts" in r.text, r.text


def test_admin_tokens_add_any_host(api):
    r = register(api, "lab-7", api.tokens["admin"], docker_url="tcp://lab-7:2376")
    assert r.status_code == 200, r.text
    assert hosts(api)["lab-7"]["agent"] is True


def test_a_busy_hosts_launch_address_does_not_move(one):
    """The attack: dgx-1's own agent token moves its docker_url while a job runs there."""
    api = one
    token, _ = agent(api, "dgx-1")
    assert register(api, "dgx-1", token, docker_url="tcp://dgx-1:2376").status_code == 200
    running = submit(api, "running", 8, "vision")
    assert api.tick() == [running]
    r = register(api, "dgx-1", token, docker_url="tcp://elsewhere:2376")
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    for part in ("host dgx-1", running,
                 "docker_url: tcp://dgx-1:2376 -> tcp://elsewhere:2376",
                 "drain the host (airflow-gpu drain dgx-1), let its jobs end"):
        assert part in detail, (part, detail)
    r = register(api, "dgx-1", token, docker_url="tcp://dgx-1:2376", address="10.9.9.9")
    assert r.status_code == 409 and "address: none -> 10.9.9.9" in r.json()["detail"]
    assert hosts(api)["dgx-1"]["docker_url"] == "tcp://dgx-1:2376"
    refused = [m for m in host_events(api, "dgx-1") if m.startswith("registration refused")]
    assert len(refused) == 2 and "tcp://elsewhere:2376" in refused[0], refused
    # an agent that retries does not fill the events with the same refusal
    assert register(api, "dgx-1", token, docker_url="tcp://dgx-1:2376",
                    address="10.9.9.9").status_code == 409
    assert host_events(api, "dgx-1")[-1] == refused[-1]
    assert len([m for m in host_events(api, "dgx-1")
                if m.startswith("registration refused")]) == 2
    # the same addresses again: nothing its job uses changes
    assert register(api, "dgx-1", token, docker_url="tcp://dgx-1:2376").status_code == 200
    assert job(api, running)["state"] == "admitted"


def test_a_restart_keeps_the_launch_addresses_agents_registered(db_url):
    """The service starting again on the same store (cluster file without a docker_url)
    keeps the agent's docker_url: its jobs still launch there, and the agent's next
    registration, the same as before, is no change (not a 409)."""
    for api in serve(db_url, hosts=ONE):
        token, _ = agent(api, "dgx-1")
        assert register(api, "dgx-1", token, docker_url="tcp://dgx-1:2376").status_code == 200
        running = submit(api, "running", 8, "vision")
        assert api.tick() == [running]
    for api in serve(db_url, hosts=ONE):          # the restart
        assert hosts(api)["dgx-1"]["docker_url"] == "tcp://dgx-1:2376"
        r = register(api, "dgx-1", token, docker_url="tcp://dgx-1:2376")
        assert r.status_code == 200, r.text
        assert job(api, running)["state"] == "admitted"


def test_an_idle_hosts_launch_address_changes_with_an_event(one):
    api = one
    token, _ = agent(api, "dgx-1")
    assert register(api, "dgx-1", token, docker_url="tcp://dgx-1:2376").status_code == 200
    r = register(api, "dgx-1", token, docker_url="tcp://dgx-1b:2376", address="10.0.0.1")
    assert r.status_code == 200, r.text
    assert hosts(api)["dgx-1"]["docker_url"] == "tcp://dgx-1b:2376"
    assert host_events(api, "dgx-1")[-1] == (
        "host dgx-1: its launch addresses changed (no jobs ran there): docker_url: "
        "tcp://dgx-1:2376 -> tcp://dgx-1b:2376; address: none -> 10.0.0.1")
    # and jobs go there
    nxt = submit(api, "next", 8, "vision")
    assert api.tick() == [nxt]


def test_agent_tokens_made_before_0013_add_no_hosts(db_url):
    engine = make_engine(db_url)
    upgrade(engine, "0012")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tokens (token_hash, team, admin, created_at, role, "
                          "hosts) VALUES (:h, 'agents', :no, CURRENT_TIMESTAMP, 'agent', "
                          ":hosts)"), {"h": auth._hash("agpu_agent_old"), "no": False,
                                       "hosts": json.dumps(["dgx-*"])})
    upgrade(engine)
    p = auth.principal_for(sessions(engine), "agpu_agent_old")
    assert p.serves("dgx-9") and not p.may_add("dgx-9")
    assert auth.token_view(auth.list_tokens(sessions(engine))[0])["allow_new_hosts"] == []
    engine.dispose()


def test_the_token_cli_allows_new_hosts(server, tmp_path):  # noqa: F811
    root = cli("token", "create", "--team", "ops", "--admin", "--db", server["db"])
    assert root.returncode == 0, root.stderr
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": root.stdout.strip()}
    out = cli("token", "create", "--agent", "--host", "lab-*", "--allow-new-hosts",
              "lab-2*", "--json", env=env)
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert (made["hosts"], made["allow_new_hosts"]) == (["lab-*"], ["lab-2*"])
    table = cli("token", "list", env=env)
    assert "may add lab-2*" in table.stdout, table.stdout
    out = cli("token", "create", "--team", "vision", "--allow-new-hosts", "x*", env=env)
    assert out.returncode == 2 and "--allow-new-hosts" in out.stderr and "--agent" in out.stderr
    body = {"topology": load_topology("dgx-a100").document()}
    with httpx.Client(base_url=server["url"], headers=bearer(made["token"])) as c:
        assert c.put("/api/v1/hosts/lab-21", json=body).status_code == 200
        r = c.put("/api/v1/hosts/lab-31", json=body)
        assert r.status_code == 403 and "--allow-new-hosts" in r.json()["detail"]
