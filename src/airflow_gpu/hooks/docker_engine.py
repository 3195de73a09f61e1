"""Each cluster host's Docker engine as an Airflow connection of the docker provider's type
(`docker`): engine certificates and registry keys live in Airflow's connections (or its
secrets backend), never in the cluster file, a job spec or a DAG.

Which connection: a pattern, `[gpu_scheduler] docker_conn_id` or the operator's
`docker_conn_id=`, where `{host}` stands for the admitted host's name with every character
other than a letter, digit or underscore turned into `_`. The default, `docker_{host}`,
gives host dgx-a-01 the connection `docker_dgx_a_01`; a host without one is reached at
its `docker_url` from the cluster file. A pattern other than the default must name
connections that exist.

A connection holds (docs/docker-connections.md):
- host, port, login, password: the registry DockerHook logs in to before pulling, as in
  the docker provider (nvcr.io, `$oauthtoken`, an NGC API key); no host: no login.
- extra `docker_url`: the engine, `tcp://dgx-a-01:2376` (TLS) or `ssh://user@dgx-a-01`
  (paramiko, with the worker user's ~/.ssh key, known_hosts and config); default: the
  host's `docker_url` in the cluster file, else DOCKER_HOST, else the local socket.
- extra `tls_ca_cert`, `tls_client_cert`, `tls_client_key`: a path on the worker or the
  PEM text itself, all three or none; `tls_verify` (default true).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import docker
from airflow.providers.docker.hooks.docker import DockerHook
from airflow.sdk import BaseHook, Connection
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException
from docker import TLSConfig
from docker.errors import APIError, DockerException

from ..launch.docker import engine
from ..launch.handle import LaunchError
from ..launch.replica import Replica

DEFAULT_PATTERN = "docker_{host}"
TLS_FILES = ("tls_ca_cert", "tls_client_cert", "tls_client_key")
_CONN_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")     # what Airflow takes as a connection id
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def check_pattern(pattern: str, name: str = "docker_conn_id") -> str:
    """The pattern, if every host name makes a valid connection id of it."""
    if not isinstance(pattern, str) or not _CONN_ID.fullmatch(pattern.replace("{host}", "h")):
        raise ValueError(f"{name}: {pattern!r} is not a connection id pattern: use letters, "
                         "digits, '_', '.', '-' and '{host}' for the host name, e.g. "
                         f"{DEFAULT_PATTERN!r}")
    return pattern


def conn_id_of(pattern: str, host: str) -> str:
    """dgx-a-01 -> docker_dgx_a_01: also a valid AIRFLOW_CONN_<ID> variable name."""
    return pattern.replace("{host}", re.sub(r"[^A-Za-z0-9_]", "_", host))


@dataclass
class DockerEngines:
    """Clients of the admitted hosts' engines through their connections (one per replica:
    each replica streams its own logs; the first replica on an engine takes over the
    client the task already made for it)."""

    pattern: str = DEFAULT_PATTERN
    default_url: str | None = None       # the operator's docker_url= for hosts without one
    _conns: dict[str, Connection | None] = field(default_factory=dict, repr=False)
    _spare: dict[tuple, docker.DockerClient] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_pattern(self.pattern)

    def conn_id(self, r: Replica) -> str:
        return conn_id_of(self.pattern, r.host)

    def connection(self, r: Replica) -> Connection | None:
        conn_id = self.conn_id(r)
        if conn_id not in self._conns:
            try:
                self._conns[conn_id] = BaseHook.get_connection(conn_id)
            except AirflowNotFoundException:
                if self.pattern != DEFAULT_PATTERN:
                    raise LaunchError(
                        f"{r.name}: host {r.host}'s Docker connection {conn_id!r} (docker_conn_id "
                        f"pattern {self.pattern!r}) does not exist: create it (type docker, "
                        "docs/docker-connections.md) or change docker_conn_id") from None
                self._conns[conn_id] = None
        return self._conns[conn_id]

    def shared(self, r: Replica) -> docker.DockerClient:
        """The client of `r`'s engine for the task's own calls (the leftover-container
        sweep); the first replica started there takes it over (`client`)."""
        key = (self.conn_id(r), r.docker_url or self.default_url)
        if key not in self._spare:
            self._spare[key] = self._new(r)
        return self._spare[key]

    def client(self, r: Replica) -> docker.DockerClient:
        """A client of `r`'s engine of its own (it streams the replica's logs): the
        engine's shared one if no replica took it yet, else a new one."""
        spare = self._spare.pop((self.conn_id(r), r.docker_url or self.default_url), None)
        return spare or self._new(r)

    def _new(self, r: Replica) -> docker.DockerClient:
        conn = self.connection(r)
        if conn is None:                 # the default pattern and no such connection
            return engine(r, self.default_url)
        return connect(conn, r, self.default_url)


def connect(conn: Connection, r: Replica, default_url: str | None = None) -> docker.DockerClient:
    """A client of the replica's host engine through DockerHook, logged in to the
    connection's registry (the client keeps the login for its pulls)."""
    where = f"{r.name}: host {r.host}'s Docker connection {conn.conn_id!r}"
    if conn.conn_type != "docker":
        raise LaunchError(f"{where}: conn_type is {conn.conn_type!r}; it must be 'docker' (the "
                          "docker provider's type, apache-airflow-providers-docker)")
    extra = conn.extra_dejson
    url = extra.get("docker_url")
    if url and r.docker_url and url != r.docker_url:
        raise LaunchError(f"{where}: extra docker_url {url!r} differs from the cluster file's "
                          f"docker_url {r.docker_url!r} for host {r.host}: keep one of them")
    url = (url or r.docker_url or default_url or os.environ.get("DOCKER_HOST")
           or "unix:///var/run/docker.sock")
    tls = tls_config(extra, url, where)
    if conn.host and not conn.login:
        raise LaunchError(f"{where}: login is empty while host (the registry) is {conn.host!r}: "
                          "set login and password (for nvcr.io: login '$oauthtoken', password an "
                          "NGC API key), or clear host to pull without logging in")
    registry = f"{conn.host}:{conn.port}" if conn.port else conn.host
    timeout = str(extra.get("timeout", 60))
    if not timeout.isdigit() or int(timeout) == 0:
        raise LaunchError(f"{where}: extra timeout is {extra['timeout']!r}: give whole seconds "
                          "for each API call, e.g. 60")
    hook = DockerHook(docker_conn_id=conn.conn_id if conn.host else None, base_url=url,
                      tls=tls, timeout=int(timeout))
    unreachable = (f"{where}: cannot reach the Docker engine at {url} ({{}}); check the "
                   "connection's extra docker_url and tls_* (a TLS engine), or the worker "
                   "user's ~/.ssh key, known_hosts and config (an ssh:// engine)")
    try:
        api = hook.get_conn()
    except APIError as exc:
        why = str(exc.explanation or exc)
        if conn.password:
            why = why.replace(conn.password, "***")
        if exc.response is None or not exc.response.url.endswith("/auth"):
            raise LaunchError(unreachable.format(why)) from None   # e.g. http to a TLS port
        # the engine asked the registry, which refused the login
        raise LaunchError(f"{where}: logging in to registry {registry} as {conn.login!r} "
                          f"failed: {why}; fix the connection's login and password (for "
                          "nvcr.io: login '$oauthtoken', password an NGC API key)") from None
    except AirflowException:
        raise LaunchError(unreachable.format(unreachable_reason(url, tls))) from None
    except Exception as exc:             # noqa: BLE001 - paramiko's, which DockerHook passes on
        raise LaunchError(unreachable.format(f"{type(exc).__name__}: {exc}")) from None
    client = docker.DockerClient.__new__(docker.DockerClient)   # around the hook's client,
    client.api = api                                            # which holds the login
    return client


def unreachable_reason(url: str, tls) -> str:
    """DockerHook logs why it could not connect but raises without it: ask once more."""
    try:
        docker.APIClient(base_url=url, tls=tls, timeout=10).ping()
    except DockerException as exc:
        return str(exc)
    except Exception as exc:             # noqa: BLE001 - ssl, socket and paramiko errors
        return f"{type(exc).__name__}: {exc}"
    return "it answered on a second try"


def tls_config(extra: dict, url: str, where: str):
    """DockerHook's TLSConfig from the connection's extra, or False without tls_*."""
    given = {k: extra[k] for k in TLS_FILES if extra.get(k)}
    if not given:
        return False
    if missing := [k for k in TLS_FILES if k not in given]:
        raise LaunchError(f"{where}: extra {', '.join(missing)} is missing: TLS needs "
                          "tls_ca_cert, tls_client_cert and tls_client_key (each a path on the "
                          "worker or the PEM text)")
    if not url.startswith(("tcp://", "https://")):
        raise LaunchError(f"{where}: tls_* is set but the engine is {url!r}: a TLS engine's "
                          "docker_url is tcp://HOST:2376 (or https://)")
    verify = str(extra.get("tls_verify", True)).lower()
    if verify not in _TRUE + _FALSE:
        raise LaunchError(f"{where}: extra tls_verify is {extra['tls_verify']!r}: use true "
                          "or false")
    ca, cert, key = (pem_file(given[k], k, where) for k in TLS_FILES)
    # DockerHook.construct_tls_config's TLSConfig, which must also keep its CA (below)
    return EngineTLS(ca_cert=ca, client_cert=(cert, key), verify=verify in _TRUE)


class EngineTLS(TLSConfig):
    """The connection's CA even where REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE is set: requests
    lets those replace a session's CA (psf/requests#3829), and the engine's CA is not in a
    system bundle. Proxies from the environment are not used for the engine either."""

    def configure_client(self, client) -> None:
        super().configure_client(client)
        client.trust_env = False


def pem_file(value: str, name: str, where: str) -> str:
    """A path for the SDK: the path given, or a private file holding the PEM text (the
    SDK reads certificates from files on each new connection, so the file stays)."""
    if not value.lstrip().startswith("-----BEGIN"):
        if not os.path.isfile(value):
            raise LaunchError(f"{where}: extra {name}: no file {value!r} on this worker: give "
                              "a path that exists here, or the PEM text itself")
        return value
    folder = Path(tempfile.gettempdir()) / f"airflow-gpu-docker-tls-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
        raise LaunchError(f"{where}: extra {name}: {folder} is not private to this user; "
                          "remove it (it holds certificates written from connections)")
    path = folder / (hashlib.sha256(value.encode()).hexdigest()[:32] + ".pem")
    if not path.exists():
        tmp = folder / f".{path.name}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value if value.endswith("\n") else value + "\n")
        os.replace(tmp, path)
    return str(path)
