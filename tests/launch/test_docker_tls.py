"""Hosts' Docker engines as Airflow connections (type docker, DockerHook): a real second
dockerd with a TLS listener on loopback and a real registry with basic auth. The image is
only in the registry, so the container starts only if the connection's login worked."""

from __future__ import annotations

import json
import logging
import uuid
from types import SimpleNamespace

import pytest

from airflow_gpu.hooks.docker_engine import DockerEngines, check_pattern, conn_id_of
from airflow_gpu.launch.docker import DockerLauncher
from airflow_gpu.launch.handle import LaunchError
from airflow_gpu.launch.replica import Replica
from airflow_gpu.operators.docker import GpuDockerOperator
from tests.launch import engines

HOST = "dgx-t-01"                     # its connection: docker_dgx_t_01 (the default rule)
CONN = "docker_dgx_t_01"
USER, PASSWORD = "ci-puller", "s3cret-registry-key-7f3a"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return engines.certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_engine(certs):
    proc, url, local, root = engines.tls_dockerd(certs)
    yield SimpleNamespace(url=url, local=local, sock=f"unix://{root}/docker.sock")
    for c in local.containers.list(all=True):
        c.remove(force=True)
    engines.stop(proc)
    engines.cleanup(root)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    proc, address = engines.registry(tmp_path_factory.mktemp("registry"), USER, PASSWORD)
    try:
        yield address, engines.push(address, USER, PASSWORD)
    finally:
        engines.stop(proc)


def replica(docker_url: str | None = None, host: str = HOST) -> Replica:
    return Replica(uuid.uuid4().hex, "main", 0, 0, host, host, docker_url, [], [], [],
                   64 * 2**20, [])


def connection(monkeypatch, conn_id: str = CONN, **fields) -> None:
    """An AIRFLOW_CONN_<ID> variable, one of the places Airflow reads connections from."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       json.dumps({"conn_type": "docker", **fields}))


def tls_extra(certs: dict, url: str, ca: str | None = None) -> dict:
    """The CA and the key as PEM text (as a secrets backend would hold them), the client
    certificate as a path on the worker: both forms work."""
    with open(ca or certs["ca"]) as f:
        ca_pem = f.read()
    with open(certs["client_key"]) as f:
        key_pem = f.read()
    return {"docker_url": url, "tls_ca_cert": ca_pem, "tls_client_cert": certs["client_cert"],
            "tls_client_key": key_pem}


def run(image: str, r: Replica, engines_: DockerEngines) -> tuple[int, list[str]]:
    launcher = DockerLauncher(image=image, network_mode="none",
                              command=["sh", "-c", "echo hello from $AIRFLOW_GPU_HOST"],
                              shm_size=None, connect=engines_.client)
    handle = launcher.start(r, {})
    lines = list(handle.lines())
    return handle.wait(), lines


def test_the_rule_from_host_to_connection():
    assert conn_id_of("docker_{host}", "dgx-a-01.lab") == "docker_dgx_a_01_lab"
    assert conn_id_of("dgx_docker", "dgx-a-01") == "dgx_docker"      # one for every host
    assert check_pattern("engines.{host}") == "engines.{host}"
    for bad in ("docker {host}", "docker_{name}", ""):
        with pytest.raises(ValueError, match=r"docker_conn_id: .* is not a connection id "
                                             r"pattern: .* e\.g\. 'docker_\{host\}'"):
            check_pattern(bad)
    with pytest.raises(ValueError, match="docker_conn_id: 'docker/{host}'"):
        GpuDockerOperator(task_id="t", image="x", docker_conn_id="docker/{host}")
    assert GpuDockerOperator(task_id="t", image="x").docker_conn_id == "docker_{host}"


def test_tls_engine_pulls_through_the_registry_login(tls_engine, registry, certs,
                                                     monkeypatch, caplog, capfd):
    url, local = tls_engine.url, tls_engine.local
    address, image = registry
    host, port = address.split(":")
    connection(monkeypatch, host=host, port=int(port), login=USER, password=PASSWORD,
               extra=tls_extra(certs, url))
    assert not local.images.list(name=image.rsplit(":", 1)[0])     # only in the registry
    caplog.set_level(logging.DEBUG)
    code, lines = run(image, replica(), DockerEngines())
    assert (code, lines) == (0, [f"hello from {HOST}"])
    assert local.images.get(image)                                  # pulled by the TLS engine
    out, err = capfd.readouterr()
    assert PASSWORD not in caplog.text + out + err


def test_a_wrong_registry_password_names_the_connection_not_the_password(
        tls_engine, registry, certs, monkeypatch, caplog, capfd):
    url = tls_engine.url
    address, _ = registry
    host, port = address.split(":")
    wrong = "wrong-key-0d9e2c41b7"
    connection(monkeypatch, host=host, port=int(port), login=USER, password=wrong,
               extra=tls_extra(certs, url))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(LaunchError) as err:
        DockerEngines().client(replica())
    msg = str(err.value)
    assert f"host {HOST}'s Docker connection {CONN!r}" in msg
    assert f"logging in to registry {address} as {USER!r} failed" in msg
    assert "fix the connection's login and password" in msg
    out, errs = capfd.readouterr()
    assert wrong not in msg + caplog.text + out + errs


def test_the_engine_refuses_clients_that_do_not_trust_it_or_have_no_certificate(
        tls_engine, certs, monkeypatch):
    url = tls_engine.url
    connection(monkeypatch, extra=tls_extra(certs, url, ca=certs["other_ca"]))
    with pytest.raises(LaunchError, match=rf"Docker connection '{CONN}': cannot reach the "
                       r"Docker engine at tcp://127\.0\.0\.1:\d+ \(.*CERTIFICATE_VERIFY_FAILED"
                       r".*\); check the connection's extra docker_url and tls_\*"):
        DockerEngines().client(replica())
    connection(monkeypatch, extra={"docker_url": url})              # no client certificate
    with pytest.raises(LaunchError, match=r"cannot reach the Docker engine at tcp://127\.0"
                       r"\.0\.1:\d+ \(.*HTTP request to an HTTPS server"):
        DockerEngines().client(replica())


def test_connection_mistakes_name_the_field_and_the_fix(tls_engine, certs, monkeypatch):
    url = tls_engine.url
    connection(monkeypatch, extra={"docker_url": url, "tls_ca_cert": certs["ca"]})
    with pytest.raises(LaunchError, match="extra tls_client_cert, tls_client_key is missing: "
                                          "TLS needs tls_ca_cert, tls_client_cert and"):
        DockerEngines().client(replica())
    connection(monkeypatch, extra={**tls_extra(certs, url), "tls_client_cert": "/nope.pem"})
    with pytest.raises(LaunchError, match="extra tls_client_cert: no file '/nope.pem' on this "
                                          "worker: give a path that exists here"):
        DockerEngines().client(replica())
    connection(monkeypatch, extra=tls_extra(certs, url))
    with pytest.raises(LaunchError, match=r"extra docker_url 'tcp://.*' differs from the "
                                          r"cluster file's docker_url 'tcp://dgx-t-01:2376'"):
        DockerEngines().client(replica("tcp://dgx-t-01:2376"))
    connection(monkeypatch, host="nvcr.io", extra=tls_extra(certs, url))
    with pytest.raises(LaunchError, match=r"login is empty while host \(the registry\) is "
                                          r"'nvcr.io': set login and password \(for nvcr.io: "
                                          r"login '\$oauthtoken'"):
        DockerEngines().client(replica())
    connection(monkeypatch, extra={"docker_url": url, "timeout": "1m"})
    with pytest.raises(LaunchError, match="extra timeout is '1m': give whole seconds"):
        DockerEngines().client(replica())
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps({"conn_type": "http"}))
    with pytest.raises(LaunchError, match="conn_type is 'http'; it must be 'docker'"):
        DockerEngines().client(replica())


def test_without_a_connection_the_default_rule_uses_the_cluster_files_docker_url(
        tls_engine, monkeypatch):
    monkeypatch.delenv(f"AIRFLOW_CONN_{CONN.upper()}", raising=False)
    client = DockerEngines().client(replica(tls_engine.sock))
    assert client.ping() and client.info()["DockerRootDir"].startswith("/tmp/agd-")
    with pytest.raises(LaunchError, match=r"host dgx-t-01's Docker connection 'engines_dgx_t_01'"
                                          r" \(docker_conn_id pattern 'engines_\{host\}'\) does "
                                          r"not exist: create it \(type docker"):
        DockerEngines("engines_{host}").client(replica())


def test_the_operator_reaches_each_host_through_the_configured_pattern(
        tls_engine, registry, certs, monkeypatch):
    """`[gpu_scheduler] docker_conn_id` sets the pattern for every GPU operator."""
    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__DOCKER_CONN_ID", "engines_{host}")
    address, image = registry
    host, port = address.split(":")
    connection(monkeypatch, "engines_dgx_t_02", host=host, port=int(port), login=USER,
               password=PASSWORD, extra=tls_extra(certs, tls_engine.url))
    op = GpuDockerOperator(task_id="t", image=image, command=["echo", "via the operator"],
                           network_mode="none")
    assert op.docker_conn_id == "engines_{host}"
    handle = op._docker(None, op.command, {}).start(replica(host="dgx-t-02"), {})
    assert list(handle.lines()) == ["via the operator"] and handle.wait() == 0
    handle.settle()              # the operator's handles remove the container on a thread
