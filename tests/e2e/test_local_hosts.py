"""The local runner starts replicas only on the host it runs on: it asks the scheduler for
that host only, and a worker that is no cluster host is refused before anything is
submitted, with the fix in the message. `[gpu_scheduler] local_host = *` (a simulated
cluster whose hosts are all this machine) starts them all, as the other e2e tests and
the demo do; the Docker runner starts a gang across hosts from any worker. And a local
replica, started by the operators through Airflow, can open its own GPU's device node
and no other's."""

from __future__ import annotations

import os
import re
import stat

import pytest

from airflow_gpu.launch import cgroups


def ran(output: str) -> list[str]:
    """What the replicas printed (the task log prefixes each line with [role-index])."""
    return re.findall(r"\] RAN (\S+(?: on \S+)?)", output)


def test_a_gang_larger_than_the_workers_host_is_refused_at_submit(run_dag, scheduler):
    """The local runner asks only for the host of its worker (placement.hosts), so a gang
    that needs two hosts can never be admitted: the scheduler refuses it at once and the
    message names the Docker runner, which starts a gang across hosts."""
    run = run_dag("gpu_local_hosts.py", "gpu_local_gang", GANG_GPUS="4",
                  AIRFLOW__GPU_SCHEDULER__LOCAL_HOST="host-1")
    assert run.result()["tasks"] == {"gang": "failed"}, run.output[-4000:]
    for part in ("the GPU scheduler refused the job", "the job does not fit even on the "
                 "idle hosts of placement.hosts (host-1): needs worker 2x(4 GPUs",
                 "The local runner asks only for the host of the worker that runs the task "
                 "(host-1, as placement.hosts)", "GpuGangOperator(runner='docker')"):
        assert part in run.output, run.output[-4000:]
    assert ran(run.output) == []
    assert all(j["state"] != "running" for j in scheduler.jobs())
    assert scheduler.http.get("/api/v1/cluster").json()["gpus_allocated"] == 0


def test_single_replica_tasks_on_a_machine_that_is_no_cluster_host_are_refused(
        run_dag, scheduler):
    """No setting: the machine's host name, which names no host of the cluster: refused
    before anything is submitted."""
    run = run_dag("gpu_local_hosts.py", "gpu_local_single",
                  AIRFLOW__GPU_SCHEDULER__LOCAL_HOST="", AIRFLOW_GPU_LOCAL_HOST="")
    assert run.result()["tasks"] == {"bash": "failed", "python": "failed"}, \
        run.output[-4000:]
    assert run.output.count("neither [gpu_scheduler] local_host nor AIRFLOW_GPU_LOCAL_HOST "
                            "is set") >= 2
    assert run.output.count("which is no host of the cluster 'e2e'") >= 2
    assert run.output.count("Nothing was submitted") >= 2
    assert ran(run.output) == []
    assert scheduler.jobs() == []


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


def test_the_docker_runner_starts_a_gang_across_hosts_from_any_worker(run_dag, scheduler):
    """The route the refusal names for a gang across hosts: each replica starts on its
    host's Docker engine (here every host's is this machine's), whatever local_host is."""
    run = run_dag("gpu_local_hosts.py", "gpu_docker_gang",
                  AIRFLOW__GPU_SCHEDULER__LOCAL_HOST="host-1")
    assert run.result()["tasks"] == {"gang": "success"}, run.output[-4000:]
    assert sorted(r.split(" on ")[1] for r in ran(run.output)) == ["host-1", "host-2"]


def test_operators_replicas_open_only_their_granted_gpus_device_nodes(
        run_dag, scheduler, tmp_path):
    """Point 3 through Airflow: a GpuBashOperator command and a @task.gpu callable, both
    resetting CUDA_VISIBLE_DEVICES, try to open /dev/nvidia0..3 made with mknod: their own
    GPU's node opens as far as the kernel goes (ENXIO: no driver here) and the other
    GPUs' are refused (EPERM) by the replica's devices cgroup."""
    if os.geteuid() != 0:
        pytest.skip("mknod of character devices and cgroups need root")
    if not (cgroups.ROOT / "devices" / "devices.deny").exists() and cgroups.version() != 2:
        pytest.skip("no cgroup devices controller here")
    nodes = tmp_path / "dev"
    nodes.mkdir()
    for minor in range(4):
        os.mknod(nodes / f"nvidia{minor}", stat.S_IFCHR | 0o666, os.makedev(195, minor))
    os.mknod(nodes / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    run = run_dag("gpu_local_hosts.py", "gpu_local_devices", DEVICE_DIR=str(nodes))
    assert run.result()["tasks"] == {"bash": "success", "python": "success"}, \
        run.output[-4000:]
    found = re.findall(r"\] OPEN (bash|python) (\d+) (nvidia\w+) (\w+)", run.output)
    opened: dict[str, dict[str, str]] = {"bash": {}, "python": {}}
    granted: dict[str, set[str]] = {"bash": set(), "python": set()}
    for task_id, gpu, node, result in found:
        opened[task_id][node] = result
        granted[task_id].add(gpu)
    for task_id in ("bash", "python"):
        (gpu,) = granted[task_id]                # one GPU, as the job asked
        assert opened[task_id] == {**{f"nvidia{m}": "EPERM" for m in range(4)},
                                   f"nvidia{gpu}": "ENXIO", "nvidiactl": "ENXIO"}, \
            (task_id, opened[task_id], run.output[-4000:])
