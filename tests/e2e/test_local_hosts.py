"""The local runner starts replicas only on the host it runs on: a grant on another host
fails the task before anything starts, with the fix in the message, and the job's GPUs
go back to the scheduler. `[gpu_scheduler] local_host = *` (a simulated cluster whose
hosts are all this machine) starts them all, as the other e2e tests and the demo do."""

from __future__ import annotations

import re


def ran(output: str) -> list[str]:
    """What the replicas printed (the task log prefixes each line with [role-index])."""
    return re.findall(r"\] RAN (\S+(?: on \S+)?)", output)


def test_a_gang_granted_on_two_hosts_is_refused_and_its_gpus_released(run_dag, scheduler):
    run = run_dag("gpu_local_hosts.py", "gpu_local_gang", GANG_GPUS="4",
                  AIRFLOW__GPU_SCHEDULER__LOCAL_HOST="host-1")
    assert run.result()["tasks"] == {"gang": "failed"}, run.output[-4000:]
    (job,) = scheduler.jobs(name="gpu_local_gang.gang")
    job = scheduler.job(job["id"])
    hosts = {r["host"]: r for r in job["replicas"]}
    assert sorted(hosts) == ["host-1", "host-2"]          # one 4-GPU replica per host
    away = hosts["host-2"]
    assert (f"1 of the job's 2 replica(s) were granted on another host than this machine, "
            f"and the local runner starts processes only here: {away['role']}-"
            f"{away['index']} on host-2 (GPUs 0,1,2,3). This machine is 'host-1' "
            "([gpu_scheduler] local_host)") in run.output
    for fix in ("queue='host-2'", "runner='docker'", "[gpu_scheduler] local_host = *",
                "Nothing was started"):
        assert fix in run.output
    assert ran(run.output) == []            # not even the replica granted on host-1
    assert job["state"] == "failed"
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0


def test_single_replica_tasks_on_a_machine_that_is_no_cluster_host_are_refused(
        run_dag, scheduler):
    """No setting: the machine's host name, which names no host of the cluster."""
    run = run_dag("gpu_local_hosts.py", "gpu_local_single",
                  AIRFLOW__GPU_SCHEDULER__LOCAL_HOST="", AIRFLOW_GPU_LOCAL_HOST="")
    assert run.result()["tasks"] == {"bash": "failed", "python": "failed"}, \
        run.output[-4000:]
    assert run.output.count("neither [gpu_scheduler] local_host nor AIRFLOW_GPU_LOCAL_HOST "
                            "is set") >= 2
    assert ran(run.output) == []
    jobs = scheduler.jobs()
    assert len(jobs) == 2 and {j["state"] for j in jobs} == {"failed"}
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0


def test_a_one_host_grant_runs_where_local_host_names_that_host(run_dag, scheduler):
    scheduler.http.post("/api/v1/hosts/host-2/drain").raise_for_status()
    run = run_dag("gpu_local_hosts.py", "gpu_local_gang", GANG_GPUS="2",
                  AIRFLOW__GPU_SCHEDULER__LOCAL_HOST="host-1")
    assert run.result()["tasks"] == {"gang": "success"}, run.output[-4000:]
    assert sorted(ran(run.output)) == ["worker-0 on host-1", "worker-1 on host-1"]


def test_the_simulated_cluster_opt_in_runs_replicas_of_every_host(run_dag, scheduler):
    run = run_dag("gpu_local_hosts.py", "gpu_local_gang", GANG_GPUS="4",
                  AIRFLOW__GPU_SCHEDULER__LOCAL_HOST="*")
    assert run.result()["tasks"] == {"gang": "success"}, run.output[-4000:]
    assert sorted(r.split(" on ")[1] for r in ran(run.output)) == ["host-1", "host-2"]
