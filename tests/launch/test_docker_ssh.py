"""A host's Docker engine over SSH through its Airflow connection (extra docker_url
ssh://user@host): a real sshd on a loopback port lets root in with a key, and paramiko
(the Docker SDK's SSH transport) runs `docker system dial-stdio` there, which reaches the
engine of scripts/ensure-docker.sh. The worker user's ~/.ssh holds the key and
known_hosts: the test gives the worker a home of its own (HOME)."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest

from airflow_gpu.hooks.docker_engine import DockerEngines
from airflow_gpu.launch.docker import DockerLauncher
from airflow_gpu.launch.handle import LaunchError
from airflow_gpu.launch.replica import Replica
from tests.launch import engines

HOST = "dgx-s-01"
CONN = "docker_dgx_s_01"


@pytest.fixture(scope="module")
def ssh(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ssh")
    public = engines.ssh_key(folder / "id_worker")
    proc, port, known = engines.sshd(folder, public)
    yield SimpleNamespace(folder=folder, port=port, known=known, key=folder / "id_worker")
    engines.stop(proc)


def replica() -> Replica:
    return Replica(uuid.uuid4().hex, "main", 0, 0, HOST, HOST, None, [], [], [], 64 * 2**20, [])


def use(monkeypatch, ssh, home: str, known_hosts: str) -> None:
    """The worker's ~/.ssh and the host's connection (no TLS: SSH carries the engine)."""
    monkeypatch.setenv("HOME", str(engines.environ_home(ssh.folder / home, ssh.key,
                                                        known_hosts)))
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps({
        "conn_type": "docker", "extra": {"docker_url": f"ssh://root@127.0.0.1:{ssh.port}"}}))


def test_a_container_on_an_engine_reached_over_ssh(ssh, monkeypatch):
    use(monkeypatch, ssh, "known", ssh.known)
    launcher = DockerLauncher(image=engines.IMAGE, network_mode="none", shm_size=None,
                              command=["sh", "-c", "echo over ssh on $AIRFLOW_GPU_HOST"],
                              connect=DockerEngines().client)
    handle = launcher.start(replica(), {})
    assert list(handle.lines()) == [f"over ssh on {HOST}"]
    assert handle.wait() == 0


def test_an_unknown_host_key_is_refused_and_the_error_says_where_to_fix_it(ssh, monkeypatch):
    use(monkeypatch, ssh, "unknown", "")
    with pytest.raises(LaunchError, match=rf"host {HOST}'s Docker connection '{CONN}': cannot "
                       rf"reach the Docker engine at ssh://root@127\.0\.0\.1:{ssh.port} \(.*"
                       r"not found in known_hosts\); .* the worker user's ~/\.ssh key, "
                       r"known_hosts and config"):
        DockerEngines().client(replica())
