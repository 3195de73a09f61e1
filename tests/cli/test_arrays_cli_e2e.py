"""Arrays, dependencies, bulk cancel and host ranges from the command line, against
`airflow-gpu server` in its own process, on SQLite and PostgreSQL: sbatch --array and
--dependency, squeue's one line for an array's waiting elements, scontrol hold, release
and update (ArrayTaskThrottle) of an array, scancel of an array, an
element and by filters (asking first), drain and resume of ranges, and every bad input
as one line with exit code 2."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import yaml

from tests.cli.test_cli_e2e import cli, server  # noqa: F401 (fixture)
from tests.helpers import REPO, until


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def job(name: str, gpus: int = 1, **more) -> dict:
    role = {"name": "w", "replicas": gpus // 8, "gpus": 8} if gpus > 8 else {
        "name": "w", "gpus": gpus}
    return {"name": name, "expected_runtime": "1h", "roles": [role], **more}


def tokens(server) -> tuple[dict, dict, dict]:  # noqa: F811
    env = {"AIRFLOW_GPU_URL": server["url"]}

    def token(*args):
        return cli("token", "create", *args, "--db", server["db"]).stdout.strip()

    return ({**env, "AIRFLOW_GPU_TOKEN": token("--team", "vision")},
            {**env, "AIRFLOW_GPU_TOKEN": token("--team", "nlp")},
            {**env, "AIRFLOW_GPU_TOKEN": token("--team", "ops", "--admin")})


def runner(env: dict):
    def run(*args, rc=0, who=None):
        out = cli(*args, env=who or env)
        assert out.returncode == rc, (args, out.stdout, out.stderr)
        return out
    return run


def test_arrays_and_dependencies_from_the_command_line(server, tmp_path):  # noqa: F811
    vision, _, _ = tokens(server)
    run = runner(vision)
    array_id = run("submit", write(tmp_path, "sweep.yaml", job("sweep", 8)), "--array",
                   "0-5%2").stdout.strip()
    until(lambda: len([j for j in json.loads(run("queue", "--json").stdout)
                       if j["state"] == "admitted"]) == 2, "two elements admitted")
    table = run("queue").stdout
    assert "sweep_0" in table and "sweep_1" in table and "sweep_[2-5%2]" in table
    assert array_id[:8] in table and "JobArrayTaskLimit" in table
    status = run("status", "sweep_3").stdout
    assert "(sweep_3, team vision): pending" in status and array_id in status
    why = json.loads(run("explain", "sweep_3", "--json").stdout)
    assert why["code"] == "JobArrayTaskLimit" and "max_running 2" in why["reason"]
    # a job of a file that waits for the array, and one that waits for an element
    chain = write(tmp_path, "chain.yaml", {"jobs": [
        job("report", depends_on="afterany:sweep"),
        job("plot", depends_on=[{"afterok": ["report"]}])]})
    report, plot = run("submit", chain).stdout.split()
    after = run("submit", write(tmp_path, "one.yaml", job("after-one")), "--dependency",
                "afterok:sweep_4").stdout.strip()
    why = until(lambda: (w := json.loads(run("explain", "report", "--json").stdout))["code"]
                == "Dependency" and "array sweep" in w["reason"] and w, "report waits")
    assert "to end (afterany" in why["reason"]
    # hold, release and update the whole array by name (scontrol hold ARRAY,
    # ArrayTaskThrottle): its pending elements at once
    out = run("hold", "sweep").stdout
    assert "(sweep_2, team vision): pending - JobHeldUser" in out
    assert "held 4 of 6 jobs; 2 passed over" in out
    assert "released 4 of 6 jobs" in run("release", "sweep").stdout
    out = run("update", "sweep", "--max-running", "3", "--priority", "4").stdout
    assert f"array sweep ({array_id[:8]}): at most 3 of its 6 elements run at once" in out
    why = json.loads(run("explain", "sweep_5", "--json").stdout)
    assert "runs at most 3 of its 6" in why["reason"]
    assert json.loads(run("status", "sweep_5", "--json").stdout)["priority"] == 4
    assert "--max-running: -1 is below 0" in run("update", "sweep", "--max-running", "-1",
                                                 rc=2).stderr
    # cancel one element, then the whole array by name
    out = run("cancel", "sweep_1").stdout
    assert "(sweep_1, team vision): cancelled" in out
    out = run("cancel", "sweep").stdout
    assert "cancelled 5 jobs" in out and "(sweep_0, team vision): cancelled" in out
    # afterany holds once every element ended; afterok on a cancelled one never does
    until(lambda: json.loads(run("status", report, "--json").stdout)["state"] == "admitted",
          "report admitted")
    why = until(lambda: (w := json.loads(run("explain", after, "--json").stdout))[
        "state"] == "cancelled" and w, "after-one cancelled")
    assert why["code"] == "DependencyNeverSatisfied"
    assert "sweep_4 (" in why["reason"] and "ended cancelled" in why["reason"]
    assert "DependencyNeverSatisfied" in run("explain", after).stdout
    assert json.loads(run("status", plot, "--json").stdout)["pending"]["code"] == "Dependency"


def test_bad_arrays_and_dependencies_are_one_line_and_exit_2(server, tmp_path):  # noqa: F811
    vision, nlp, _ = tokens(server)
    run = runner(vision)
    one = write(tmp_path, "one.yaml", job("one"))
    two = write(tmp_path, "two.yaml", {"jobs": [job("a"), job("b")]})

    def refused(*args):
        err = run(*args, rc=2).stderr
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        return err

    err = refused("submit", one, "--array", "0-999999")
    assert "array.range" in err and "1000000 elements" in err and "(10000)" in err
    for bad, said in (("5-1", "runs backwards"), ("a-b", "no index range"),
                      ("%0", "%0 is no limit")):
        assert said in refused("submit", one, "--array", bad)
    assert "--array: it applies to a file of one job, and this one holds 2" in refused(
        "submit", two, "--array", "0-3")
    err = refused("submit", write(tmp_path, "big.yaml", job("big", array="0-999999")))
    assert "jobs[0].array.range" in err and "1000000" in err
    assert "--dependency 'afterok:a::b': depends_on" in refused(
        "submit", one, "--dependency", "afterok:a::b")
    assert "is no dependency kind" in refused("submit", one, "--dependency", "befor:x")
    err = refused("submit", one, "--dependency", "afterok:nowhere")
    assert "--dependency: depends_on[0].afterok[0]: 'nowhere' names no job your token can " \
        "see" in err
    theirs = runner(nlp)("submit", write(tmp_path, "t.yaml", job("theirs"))).stdout.strip()
    err = refused("submit", one, "--dependency", f"afterok:{theirs[:8]}")
    assert "names no job your token can see" in err and "nlp" not in err
    cycle = write(tmp_path, "cycle.yaml", {"jobs": [job("a", depends_on="afterok:b"),
                                                    job("b", depends_on="afterok:a")]})
    assert "the jobs a, b wait for each other (a -> b -> a)" in refused("submit", cycle)
    assert "give a job" in refused("cancel")
    assert "--state: 'succeeded'" in refused("cancel", "--state", "succeeded")
    # nothing of vision's was submitted
    assert [j["name"] for j in json.loads(run("queue", "--json").stdout)] == ["theirs"]


def test_cancel_by_filters_asks_first_and_sees_only_its_team(server, tmp_path):  # noqa: F811
    vision, nlp, admin = tokens(server)
    run = runner(vision)
    ids = [runner(env)("submit", write(tmp_path, f"{name}.yaml", job(name, 16))).stdout.strip()
           for name, env in (("train", vision), ("eval", vision), ("train", nlp))]
    # vision's train holds all 16 GPUs (once a pass admitted it): its eval and nlp's train pend
    until(lambda: json.loads(run("status", ids[0], "--json").stdout)["state"] == "admitted",
          "vision's train admitted")
    err = run("cancel", "--state", "pending", rc=2).stderr
    assert "1 job match: eval (" in err and "1 job would be cancelled" in err and \
        "add --yes" in err
    out = run("cancel", "--name", "train", "--yes")
    assert "1 job match: train (" in out.stderr and "(train, team vision): cancelled" in \
        out.stdout
    # on a terminal it asks; "y" cancels (the real command, its stdin a terminal)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "airflow_gpu.cli", "cancel", "--team",
                             "vision"], stdin=follower, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **vision})
    os.close(follower)
    os.write(leader, b"y\n")
    out, err = proc.communicate(timeout=60)
    os.close(leader)
    assert proc.returncode == 0, err
    assert "Cancel this job? [y/N]" in err and "(eval, team vision): cancelled" in out
    left = {(j["name"], j["team"]): j["state"]
            for j in json.loads(run("queue", "--all", "--json", who=admin).stdout)}
    assert left[("train", "nlp")] != "cancelled"      # nlp's: left alone
    assert "403" in run("cancel", "--team", "nlp", "--yes", rc=1).stderr
    assert "cancelled" in run("cancel", "--team", "nlp", "--yes", who=admin).stdout


def test_drain_and_resume_take_host_ranges(server):  # noqa: F811
    _, _, admin = tokens(server)
    run = runner(admin)
    out = run("drain", "dgx-[1-2]", "--reason", "rack work").stdout
    assert out.splitlines() == ["dgx-1: drained (reason: rack work)",
                                "dgx-2: drained (reason: rack work)"]
    err = run("resume", "dgx-[1-3]", rc=1).stderr
    assert "hosts: dgx-3 is not in the cluster; nothing was resumed" in err
    assert all(h["drained"] for h in json.loads(run("cluster", "--json").stdout)["hosts"])
    assert run("resume", "dgx-[1-2]").stdout.splitlines() == ["dgx-1: in service",
                                                             "dgx-2: in service"]
