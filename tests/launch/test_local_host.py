"""Which cluster host the local runner is on, and its refusal of replicas granted on
another: `[gpu_scheduler] local_host`, then $AIRFLOW_GPU_LOCAL_HOST (the node agent's
name too), then the host name, full or short; `*` accepts every host."""

from __future__ import annotations

import argparse
import socket

import pytest

from airflow_gpu.agent.cli import FLAGS, _config
from airflow_gpu.launch.handle import LaunchError
from airflow_gpu.launch.local import local_host, refuse_other_hosts
from airflow_gpu.launch.replica import Replica


def fqdn() -> str:
    return "dgx-a-01.lab.example"


def replica(index: int, host: str, gpus=(0,)) -> Replica:
    return Replica("j1", "worker", index, index, host, host, None, list(gpus), [0], [0],
                   2**20, [])


def test_the_setting_wins_then_the_variable_then_the_host_name():
    env = {"AIRFLOW_GPU_LOCAL_HOST": "dgx-b-02"}
    here = local_host("dgx-c-03", env, fqdn)
    assert here.names == ("dgx-c-03",) and here.source == "[gpu_scheduler] local_host"
    here = local_host("", env, fqdn)
    assert here.names == ("dgx-b-02",) and here.source == "AIRFLOW_GPU_LOCAL_HOST"
    here = local_host(None, {"AIRFLOW_GPU_LOCAL_HOST": "  "}, fqdn)
    assert here.names == ("dgx-a-01.lab.example", "dgx-a-01")      # full or short
    assert here.source.startswith("its host name")
    assert here.matches("dgx-a-01") and not here.matches("dgx-a-02")


def test_a_star_accepts_every_host_and_wins_like_a_name():
    assert local_host("*", {"AIRFLOW_GPU_LOCAL_HOST": "dgx-b-02"}, fqdn).matches("anything")
    here = local_host(None, {"AIRFLOW_GPU_LOCAL_HOST": "*"}, fqdn)
    assert here.names == () and here.matches("dgx-z-99")
    assert not local_host("dgx-c-03", {"AIRFLOW_GPU_LOCAL_HOST": "*"}, fqdn).matches("x")


def test_the_node_agent_and_the_local_runner_agree_on_the_name(monkeypatch):
    args = argparse.Namespace(config=None, **dict.fromkeys(FLAGS))
    monkeypatch.setenv("AIRFLOW_GPU_LOCAL_HOST", "dgx-b-02")
    assert _config(args).name == "dgx-b-02" == local_host().names[0]
    monkeypatch.setenv("AIRFLOW_GPU_LOCAL_HOST", "*")      # not a name: the host name
    assert _config(args).name == socket.gethostname().split(".")[0]
    monkeypatch.delenv("AIRFLOW_GPU_LOCAL_HOST")
    assert local_host().matches(_config(args).name)        # both default to the host name
    args.name = "dgx-c-03"                                 # --name wins for the agent
    assert _config(args).name == "dgx-c-03"


def test_replicas_granted_elsewhere_are_named_with_the_fix():
    here = local_host("dgx-a-01")
    refuse_other_hosts([replica(0, "dgx-a-01"), replica(1, "dgx-a-01")], here)
    with pytest.raises(LaunchError) as err:
        refuse_other_hosts([replica(0, "dgx-a-01"), replica(1, "dgx-a-02", (2, 3)),
                            replica(2, "dgx-a-03", ())], here)
    text = str(err.value)
    assert ("2 of the job's 3 replica(s) were granted on another host than this machine, "
            "and the local runner starts processes only here: worker-1 on dgx-a-02 (GPUs "
            "2,3), worker-2 on dgx-a-03 (GPUs none). This machine is 'dgx-a-01' "
            "([gpu_scheduler] local_host)") in text
    assert "the GPUs and cores of dgx-a-02, dgx-a-03 on this machine" in text
    for fix in ("queue='dgx-a-02'", "GpuGangOperator(runner='docker')",
                "set [gpu_scheduler] local_host (or AIRFLOW_GPU_LOCAL_HOST)",
                "[gpu_scheduler] local_host = *"):
        assert fix in text
    refuse_other_hosts([replica(1, "dgx-a-02")], local_host("*"))
