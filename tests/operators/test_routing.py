"""Which host a local-runner task asks for: its worker's (`placement.hosts`). A worker
that is no cluster host, or that took another host's queue, is refused before anything
is submitted, with the fix; `local_host = *` (a simulated cluster) asks for none."""

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_gpu.launch.local import local_host
from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.operators.docker import GpuDockerOperator
from airflow_gpu.operators.routing import worker_host

HOSTS = ["dgx-01", "dgx-02", "dgx-03"]


def here(name: str):
    return local_host(name, {}, lambda: "unused")


def test_the_worker_asks_for_its_own_host_and_a_simulated_cluster_for_none():
    assert worker_host(here("dgx-02"), HOSTS, "lab", "t", "dgx-02") == "dgx-02"
    assert worker_host(here("dgx-02"), HOSTS, "lab", "t", "default") == "dgx-02"
    full = local_host("", {}, lambda: "dgx-03.lab.example")       # the host name, short
    assert worker_host(full, HOSTS, "lab", "t", "dgx-03") == "dgx-03"
    assert worker_host(here("*"), HOSTS, "lab", "t", "dgx-01") is None


def test_a_worker_that_is_no_cluster_host_is_refused_with_the_fix():
    with pytest.raises(AirflowFailException) as err:
        worker_host(here("cpu-7"), HOSTS, "lab", "train", "default")
    msg = str(err.value)
    for part in ("task 'train' uses the local runner", "this worker is 'cpu-7' "
                 "([gpu_scheduler] local_host), which is no host of the cluster 'lab' (its "
                 "hosts: dgx-01, dgx-02, dgx-03); the task was on queue 'default'",
                 "Nothing was submitted", "queue='dgx-01' on the operator",
                 "GpuGangOperator(runner='docker')"):
        assert part in msg, msg


def test_a_worker_serving_another_hosts_queue_is_refused():
    with pytest.raises(AirflowFailException) as err:
        worker_host(here("dgx-01"), HOSTS, "lab", "train", "dgx-02")
    msg = str(err.value)
    assert ("task 'train' was sent to queue 'dgx-02', the queue of host dgx-02, but the "
            "worker that took it is 'dgx-01'") in msg
    assert "airflow celery worker --queues dgx-02` on dgx-02" in msg


def test_only_the_local_runner_pins_its_job():
    assert GpuBashOperator(task_id="b", bash_command="true", gpus=1).starts_here
    assert not GpuDockerOperator(task_id="d", image="x", gpus=1).starts_here
    bash = GpuBashOperator(task_id="b", bash_command="true", gpus=1)
    assert bash._spec("j", host="dgx-02")["placement"] == {"hosts": ["dgx-02"]}
    assert "placement" not in bash._spec("j")
