"""`airflow-gpu run` on a cluster of several hosts: it asks for this machine's host
(AIRFLOW_GPU_LOCAL_HOST, as the local runner does), so it waits for that host rather than
being granted an emptier one and refusing it; srun's placement flags (--nodelist/-w with
host ranges, --exclude/-x, --gpu-model/--constraint, --min-gpu-memory, --mig); and every
mistake it can see is refused in one line, exit 2, before anything is submitted.

Real server processes on SQLite: three hosts of this machine's model (host-3 with a MIG
GPU), and the built-in example cluster for the README's `run --gpus 1` line."""

from __future__ import annotations

import os
import re
import signal

import httpx
import pytest
import yaml

from tests.e2e.conftest import create_token, machine_model
from tests.helpers import PYTHONPATH, until
from tests.launch.test_run_cli import job, job_id_of, run, start
from tests.servers import Server

SMALL = ("--memory", "64MiB", "--poll-interval", "0.2")
ECHO = ("--", "sh", "-c", "echo $AIRFLOW_GPU_HOST $CUDA_VISIBLE_DEVICES")


def stack(tmp, cluster) -> dict:
    db = f"sqlite:///{tmp}/scheduler.db"
    srv = Server(db, cluster, lease_ttl=300, log=tmp / "server.log", interval=0.2)
    admin = httpx.Client(base_url=srv.url, timeout=10, headers={
        "Authorization": f"Bearer {create_token(db, 'ops', '--admin')}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__GPU_SCHEDULER")}
    env.update(AIRFLOW_GPU_URL=srv.url, AIRFLOW_GPU_TOKEN=create_token(db, "ml"),
               AIRFLOW_GPU_LOCAL_HOST="host-1", PYTHONPATH=PYTHONPATH,
               AIRFLOW_HOME=str(tmp / "no-airflow"))
    return {"env": env, "admin": admin, "tmp": tmp, "server": srv}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run-hosts")
    model = str(machine_model(tmp / "this-machine.yaml"))
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "three", "hosts": [
        {"name": "host-[1-2]", "model": model, "rack": "r1", "switch": "s1"},
        {"name": "host-3", "model": model, "rack": "r1", "switch": "s1",
         "mig": {"gpus": [3], "layout": ["1g.10gb"] * 7}}]}))
    s = stack(tmp, cluster)
    yield s
    s["admin"].close()
    s["server"].stop()


def jobs(server) -> list[dict]:
    return server["admin"].get("/api/v1/jobs").raise_for_status().json()


def submit(server, spec: dict) -> dict:
    body = {"spec": spec, "idempotency_key": spec["name"]}
    return server["admin"].post("/api/v1/jobs", json=body).raise_for_status().json()


def test_run_waits_for_this_machines_host_though_others_are_free(server):
    holder = submit(server, {"name": "holder", "team": "ops", "roles": [
        {"name": "w", "gpus": 3, "memory": "64MiB"}], "placement": {"hosts": ["host-1"]}})
    until(lambda: job(server, holder["id"])["state"] == "admitted", "the holder's admission")
    proc, out, err = start(server, "mine", "--gpus", "2", *SMALL, *ECHO)
    try:    # host-2 and host-3 are empty; only 1 GPU is free here, on host-1
        line = until(lambda: re.search(r"job (\S+) pending: (\S+)", err.read_text()),
                     "the pending line", 60)
        mine = job(server, line.group(1))
        assert mine["state"] == "pending" and mine["spec"]["placement"]["hosts"] == ["host-1"]
        server["admin"].delete(f"/api/v1/jobs/{holder['id']}").raise_for_status()
        assert proc.wait(60) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    done = job(server, mine["id"])
    assert done["state"] == "succeeded"
    assert {r["host"] for r in done["replicas"]} == {"host-1"}
    gpus = ",".join(map(str, done["replicas"][0]["gpus"]))
    assert out.read_text() == f"host-1 {gpus}\n"


def test_nodelist_ranges_and_exclusions_on_a_simulated_cluster(server):
    got = run(server, "-w", "host-[1-3]", "-x", "host-1,host-3", "--gpus", "1", *SMALL, *ECHO,
              AIRFLOW_GPU_LOCAL_HOST="*")
    assert got.returncode == 0, got.stderr
    done = job(server, job_id_of(got.stderr))
    assert done["spec"]["placement"]["hosts"] == ["host-2"]
    assert got.stdout.startswith("host-2 ")
    got = run(server, "--exclude", "host-[1-2]", "--gpus", "1", *SMALL, *ECHO,
              AIRFLOW_GPU_LOCAL_HOST="*")
    assert got.returncode == 0, got.stderr
    assert job(server, job_id_of(got.stderr))["spec"]["placement"]["hosts"] == ["host-3"]


def test_gpu_constraints_and_mig_devices_from_the_flags(server):
    got = run(server, "--nodelist", "host-[1-2]", "--gpus", "1", "--constraint", "H100|A100",
              "--min-gpu-memory", "40GiB", *SMALL, *ECHO)
    assert got.returncode == 0, got.stderr
    role = job(server, job_id_of(got.stderr))["spec"]["roles"][0]
    assert role["gpu"] == {"model": ["H100", "A100"], "min_memory": "40GiB"}
    # host-3's MIG devices: granted as asked (NVML cannot name them here: exit 2, failed)
    got = run(server, "--mig", "1g.10gb", "--gpus", "2", *SMALL, "--", "true",
              AIRFLOW_GPU_LOCAL_HOST="host-3")
    done = job(server, job_id_of(got.stderr))
    assert done["spec"]["roles"][0]["gpu"]["mig"] == {"profile": "1g.10gb", "count": 2}
    assert [m["profile"] for m in done["replicas"][0]["mig"]] == ["1g.10gb", "1g.10gb"]
    assert (got.returncode, done["state"]) == (2, "failed")


def test_a_job_file_takes_host_ranges_and_this_machines_host(server):
    spec = server["tmp"] / "ranged.yaml"
    spec.write_text(yaml.safe_dump({"name": "ranged", "placement": {"hosts": "host-[1-2]"},
                                    "roles": [{"name": "eval", "gpus": 1, "memory": "64MiB"}]}))
    got = run(server, str(spec), "--poll-interval", "0.2", *ECHO,
              AIRFLOW_GPU_LOCAL_HOST="host-2")
    assert got.returncode == 0, got.stderr
    done = job(server, job_id_of(got.stderr))
    assert done["spec"]["placement"]["hosts"] == ["host-2"]
    assert got.stdout.startswith("host-2 ")


@pytest.mark.parametrize(("args", "local", "said"), [
    (("JOBFILE",), "host-1", "ranged.yaml: placement.hosts: host-1, host-2 leaves out this "
     "machine, host-3 (AIRFLOW_GPU_LOCAL_HOST), and run starts the command here. Nothing "
     "was submitted. To fix: run it on one of those hosts, add host-3"),
    (("-w", "host-2", "--gpus", "1"), "host-1", "--nodelist: host-2 leaves out this machine, "
     "host-1"),
    (("-x", "host-[1-2]", "--gpus", "1"), "host-1", "--exclude: host-[1-2] excludes this "
     "machine, host-1"),
    (("--gpus", "1"), "host-9", "this machine is 'host-9' (AIRFLOW_GPU_LOCAL_HOST), which is "
     "no host of the cluster 'three' (its hosts: host-1, host-2, host-3)"),
    (("-w", "host-[1-4]", "--gpus", "1"), "*", "--nodelist: host-4 is no host of the "
     "cluster 'three'"),
    (("-w", "host-[3-1]", "--gpus", "1"), "*", "--nodelist: host range '3-1' in "
     "'host-[3-1]' runs backwards"),
    (("-x", "host-[1-3]", "--gpus", "1"), "*", "--exclude: host-[1-3] leaves no host in the "
     "cluster"),
    (("--cpus", "0"), "host-1", "--cpus: 0 logical CPUs per replica; a replica needs at "
     "least 1"),
    (("--mig", "bogus"), "host-1", "run: --mig: 'bogus' is not a MIG profile"),
    (("--gpu-model", "A100"), "host-1", "--gpu-model: a GPU constraint, but the job asks "
     "for no GPUs"),
    (("--gpus", "3", "--replicas", "2", "--memory", "64MiB"), "host-1", "placement.hosts "
     "(host-1): needs main 2x(3 GPUs, 1 CPU, 64MiB), they have 4 eligible GPUs; add hosts "
     "to placement.hosts or shrink the job. run asks only for this machine's host (host-1"),
])
def test_mistakes_are_refused_in_one_line_before_submitting(server, args, local, said):
    if args == ("JOBFILE",):
        spec = server["tmp"] / "ranged.yaml"
        spec.write_text(yaml.safe_dump({"name": "ranged", "placement": {
            "hosts": ["host-[1-2]"]}, "roles": [{"name": "eval", "memory": "64MiB"}]}))
        args, local = (str(spec),), "host-3"
    before = len(jobs(server))
    mark = server["tmp"] / "ran"
    got = run(server, *args, "--", "touch", str(mark), AIRFLOW_GPU_LOCAL_HOST=local)
    assert got.returncode == 2, got.stderr
    assert said in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert len(jobs(server)) == before and not mark.exists()


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    s = stack(tmp_path_factory.mktemp("run-example"), "example")
    yield s
    s["admin"].close()
    s["server"].stop()


def test_the_readmes_run_line_on_the_example_cluster(example):
    """README: `run --gpus 1 -- nvidia-smi -L` with AIRFLOW_GPU_LOCAL_HOST naming one of
    the example cluster's hosts (its cores are not this machine's: warned, not refused)."""
    got = run(example, "--gpus", "1", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
              AIRFLOW_GPU_LOCAL_HOST="dgx-h-03")
    assert got.returncode == 0, got.stderr
    done = job(example, job_id_of(got.stderr))
    assert [r["host"] for r in done["replicas"]] == ["dgx-h-03"]
    assert got.stdout == f"{done['replicas'][0]['gpus'][0]}\n"
    assert "granted main-0 on dgx-h-03: GPUs" in got.stderr


def test_placement_hosts_takes_ranges_and_counts_them_against_the_cap():
    from airflow_gpu.scheduler_core.errors import InputError, validate
    from airflow_gpu.scheduler_core.jobspec import JobSpec

    def hosts(value):
        spec = {"name": "j", "roles": [{"name": "r"}], "placement": {"hosts": value}}
        return validate(JobSpec, spec, "job.yaml").placement.hosts

    assert hosts("dgx-a-[01-03,07],dgx-h-05") == ["dgx-a-01", "dgx-a-02", "dgx-a-03",
                                                  "dgx-a-07", "dgx-h-05"]
    assert hosts(["n[1-2]", "n1", "m"]) == ["n1", "n2", "m"]         # once each
    with pytest.raises(InputError, match=r"job.yaml: placement.hosts: 'n\[1-5000\]' brings "
                       "the hosts named to more than 4096"):
        hosts("n[1-5000]")
    with pytest.raises(InputError, match="placement.hosts: host range '3-1' in 'n\\[3-1\\]' "
                       "runs backwards"):
        hosts(["n[3-1]"])
