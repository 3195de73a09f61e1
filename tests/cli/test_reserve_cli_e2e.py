"""Reservations as an admin and a team make and use them from the command line, against
`airflow-gpu server` in its own process, on SQLite and PostgreSQL: reserve create, list,
show, update and delete, a team's job and `run --reservation` inside it, `cluster`
showing what is reserved now and next, `acct --by reservation`, and bad input."""

from __future__ import annotations

import json

import yaml

from tests.cli.test_cli_e2e import cli, server, wait_state  # noqa: F401 (fixture)


def test_reservations_from_the_command_line(server, tmp_path):  # noqa: F811
    token = cli("token", "create", "--team", "vision", "--db", server["db"]).stdout.strip()
    admin = cli("token", "create", "--team", "ops", "--admin", "--db",
                server["db"]).stdout.strip()
    env = {"AIRFLOW_GPU_URL": server["url"], "AIRFLOW_GPU_TOKEN": token}
    as_admin = {**env, "AIRFLOW_GPU_TOKEN": admin}

    def run(*args, who=as_admin, rc=0):
        out = cli(*args, env=who)
        assert out.returncode == rc, (args, out.stdout, out.stderr)
        return out

    made = run("reserve", "create", "fw", "--hosts", "dgx-2", "--start", "now+1h",
               "--duration", "2h", "--maint").stdout
    assert made.startswith("maintenance reservation fw: dgx-2 from ") and "(2h, upcoming)" in made
    made = run("reserve", "create", "vis", "--hosts", "dgx-1", "--duration", "1h",
               "--team", "vision").stdout
    assert "reservation vis for vision: dgx-1" in made and "active" in made
    listed = json.loads(run("reserve", "list", "--json").stdout)
    assert [(r["name"], r["state"], r["maint"]) for r in listed] == [
        ("vis", "active", False), ("fw", "upcoming", True)]
    table = run("reserve", "list", who=env).stdout          # anyone may read them
    assert "MAINT" in table and "vision" in table

    # the team's job runs inside its reservation; `run` asks for it too
    job = tmp_path / "in.yaml"
    job.write_text(yaml.safe_dump({"name": "in-res", "reservation": "vis",
                                   "expected_runtime": "30m",
                                   "roles": [{"name": "w", "gpus": 4}]}))
    run("submit", str(job), who=env)
    got = wait_state(env, "in-res", "admitted")
    assert [r["host"] for r in got["replicas"]] == ["dgx-1"] and got["reservation"] == "vis"
    out = run("run", "--reservation", "vis", "--gpus", "2", "--expected-runtime", "5m",
              "--", "sh", "-c", "echo on-$AIRFLOW_GPU_HOST",
              who={**env, "AIRFLOW_GPU_LOCAL_HOST": "*"})
    assert "on-dgx-1" in out.stdout + out.stderr

    # cluster: what is reserved now and next, per host
    table = run("cluster", who={**env, "COLUMNS": "250"}).stdout
    assert "reserved: vis (vision) until" in table and "next: fw (maint)" in table
    view = json.loads(run("cluster", "--json", who=env).stdout)
    assert [r["name"] for r in view["reservations"]] == ["vis", "fw"]

    # acct --by reservation: what it held and what its jobs used of it
    rows = {r["reservation"]: r for r in json.loads(
        run("acct", "--by", "reservation", "--json", who=env).stdout)["rows"]}
    vis = rows["vis"]
    assert vis["jobs"] == 2 and vis["used_gpu_hours"] > 0
    assert vis["reserved_gpu_hours"] >= vis["used_gpu_hours"]
    assert abs(vis["reserved_gpu_hours"] - vis["used_gpu_hours"]
               - vis["unused_gpu_hours"]) < 2e-4
    assert "fw" not in rows                 # it has not started: nothing held yet
    assert "unused GPU-h" in run("acct", "--by", "reservation", who={
        **env, "COLUMNS": "200"}).stdout

    # bad input: one line naming the field, nothing made
    out = run("reserve", "create", "x", "--hosts", "dgx-2", "--start", "now+90m",
              "--duration", "1h", "--maint", rc=2)
    assert "hosts: dgx-2 is in reservation 'fw'" in out.stderr
    out = run("reserve", "create", "y", "--hosts", "dgx-1", "--gpus", "8", "--duration",
              "1h", "--maint", rc=2)
    assert "--hosts" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = run("reserve", "create", "big", "--hosts", "dgx-a-[01-9999999]", "--duration",
              "1h", "--maint", rc=2)
    assert "hosts: host range 'dgx-a-[01-9999999]' names 9,999,999 hosts" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run("reserve", "create", "twice", "--hosts", "dgx-2", "--start", "now+5h",
              "--duration", "1h", "--team", "vision", "--team", "vision", rc=2)
    assert "teams: 'vision' is named twice; name each team once" in out.stderr
    out = run("reserve", "create", "z", "--hosts", "dgx-2", "--duration", "1h",
              "--maint", who=env, rc=1)
    assert "only admins" in out.stderr
    assert [r["name"] for r in json.loads(run("reserve", "list", "--json").stdout)] == [
        "vis", "fw"]

    # update and delete
    changed = run("reserve", "update", "fw", "--duration", "3h").stdout
    assert "(3h, upcoming)" in changed
    shown = json.loads(run("reserve", "show", "fw", "--json").stdout)
    assert shown["duration_s"] == 3 * 3600
    assert "deleted maintenance reservation fw" in run("reserve", "delete", "fw").stdout
    assert [r["name"] for r in json.loads(run("reserve", "list", "--json").stdout)] == ["vis"]

    # a deleted reservation stays in the accounting, up to its deletion, with its jobs
    run("reserve", "delete", "vis")
    rows = json.loads(run("acct", "--by", "reservation", "--json", who=env).stdout)["rows"]
    assert [(r["reservation"], r["state"], r["jobs"]) for r in rows] == [("vis", "deleted", 2)]
