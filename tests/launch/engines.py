"""Real servers on loopback for the Docker-connection tests: a second dockerd with a TLS
listener (its own data root, exec root, pidfile, socket and containerd; the engine of
scripts/ensure-docker.sh is left as it is), an sshd, a registry with basic auth, and the
certificates and keys they use. scripts/ensure-docker-remote.sh installs the packages."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import bcrypt
import docker
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

IMAGE = "airflow-gpu-test/busybox:1"        # scripts/ensure-docker.sh imports it
FIX = "run scripts/ensure-docker.sh and scripts/ensure-docker-remote.sh (make test does)"


def need(path: str, package: str) -> str:
    found = shutil.which(path)
    if not found:
        pytest.fail(f"{path} is missing (Debian package {package}): {FIX}")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_dir(prefix: str) -> Path:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def wait_for(ready, what: str, proc: subprocess.Popen, log: Path, timeout: float = 30):
    """Until `ready()`; a server that never gets there is stopped, not left behind."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if ready():
                return
        except Exception:       # noqa: BLE001,S110 - not listening yet
            pass
        time.sleep(0.2)
    stop(proc)
    pytest.fail(f"{what} did not become ready in {timeout}s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


# --- certificates -------------------------------------------------------------------

def _pem(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    path.chmod(0o600)
    return str(path)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert(subject: str, key, issuer_name, issuer_key, *, ca=False, server=False):
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def certificates(folder: Path) -> dict[str, str]:
    """A CA, the engine's certificate (127.0.0.1) and a client's, all signed by it, plus
    another CA that signed nothing here."""
    def ca(name):
        key = ec.generate_private_key(ec.SECP256R1())
        return key, _cert(name, key, None, key, ca=True)

    ca_key, ca_cert = ca("airflow-gpu test CA")
    other_key, other_cert = ca("another CA")
    out = {"ca": _pem(folder / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM)),
           "other_ca": _pem(folder / "other-ca.pem",
                            other_cert.public_bytes(serialization.Encoding.PEM))}
    for name, server in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(name, key, ca_cert.subject, ca_key, server=server)
        out[f"{name}_cert"] = _pem(folder / f"{name}-cert.pem",
                                   cert.public_bytes(serialization.Encoding.PEM))
        out[f"{name}_key"] = _pem(folder / f"{name}-key.pem", _key_pem(key))
    return out


def ssh_key(path: Path) -> str:
    """An ed25519 key pair in OpenSSH format; returns the public key line."""
    key = ed25519.Ed25519PrivateKey.generate()
    _pem(path, key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.OpenSSH,
                                 serialization.NoEncryption()))
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH).decode()


# --- servers ------------------------------------------------------------------------

def tls_dockerd(certs: dict[str, str]):
    """A second engine: TLS on a loopback port, verifying clients against the CA."""
    dockerd = need("dockerd", "docker.io")
    root, port = short_dir("agd-"), free_port()
    log = root / "dockerd.log"
    proc = start([dockerd, "--data-root", f"{root}/data", "--exec-root", f"{root}/exec",
                  "--pidfile", f"{root}/dockerd.pid", "-H", f"unix://{root}/docker.sock",
                  "-H", f"tcp://127.0.0.1:{port}", "--tlsverify", "--tlscacert", certs["ca"],
                  "--tlscert", certs["server_cert"], "--tlskey", certs["server_key"],
                  "--storage-driver=vfs", "--bridge=none", "--iptables=false",
                  "--ip-masq=false", "--containerd-namespace", "airflow-gpu-tls",
                  "--containerd-plugins-namespace", "airflow-gpu-tls-plugins"], log)
    sock = f"unix://{root}/docker.sock"
    wait_for(lambda: docker.DockerClient(base_url=sock, timeout=10).ping(), "the TLS dockerd",
             proc, log)
    local = docker.DockerClient(base_url=sock, timeout=10)
    return proc, f"tcp://127.0.0.1:{port}", local, root


def sshd(folder: Path, authorized_key: str):
    """sshd on a loopback port that lets root in with `authorized_key` only; root reaches
    the default engine's socket, as `docker system dial-stdio` needs."""
    binary = need("/usr/sbin/sshd", "openssh-server")
    port = free_port()
    host_pub = ssh_key(folder / "host_key")
    (folder / "authorized_keys").write_text(authorized_key + "\n")
    config = folder / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {folder}/host_key
PidFile {folder}/sshd.pid
AuthorizedKeysFile {folder}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
LogLevel INFO
""")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)     # its privilege separation dir
    log = folder / "sshd.log"
    proc = start([binary, "-D", "-e", "-f", str(config)], log)

    def listening():
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-")
    wait_for(listening, "sshd", proc, log)
    return proc, port, f"[127.0.0.1]:{port} {host_pub}"


def registry(folder: Path, user: str, password: str):
    """A registry (docker-registry) on a loopback port with htpasswd (bcrypt) basic auth;
    the engines take 127.0.0.0/8 registries over plain HTTP."""
    binary = need("docker-registry", "docker-registry")
    port = free_port()
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    (folder / "htpasswd").write_text(f"{user}:{hashed}\n")
    config = folder / "registry.yml"
    config.write_text(f"""version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: {folder}/data}}}}
http: {{addr: "127.0.0.1:{port}", secret: airflow-gpu-test}}
auth: {{htpasswd: {{realm: airflow-gpu-test, path: {folder}/htpasswd}}}}
""")
    log = folder / "registry.log"
    proc = start([binary, "serve", str(config)], log)
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/v2/").status_code == 401,
             "the registry", proc, log)
    return proc, f"127.0.0.1:{port}"


def push(address: str, user: str, password: str) -> str:
    """The test image pushed from the default engine into the registry; its name there."""
    try:
        engine = docker.from_env()
        engine.images.get(IMAGE)
    except docker.errors.DockerException as exc:     # no engine, or no test image
        pytest.fail(f"the default engine has no image {IMAGE} ({exc}): {FIX}")
    repo = f"{address}/airflow-gpu-test/busybox"
    engine.images.get(IMAGE).tag(repo, "1")
    try:
        for line in engine.api.push(repo, "1", stream=True, decode=True,
                                    auth_config={"username": user, "password": password}):
            assert "error" not in line, line
    finally:
        engine.images.remove(f"{repo}:1")
    return f"{repo}:1"


def environ_home(folder: Path, key_path: Path, known_hosts: str) -> Path:
    """A home for the worker user: ~/.ssh with the key (IdentityFile) and known_hosts."""
    ssh = folder / "home" / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    (ssh / "config").write_text(f"Host 127.0.0.1\n  IdentityFile {key_path}\n")
    (ssh / "known_hosts").write_text(known_hosts + "\n")
    return ssh.parent


def cleanup(path: Path) -> None:
    """Remove what root-owned daemons left (vfs layers are plain directories)."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        subprocess.run(["rm", "-rf", str(path)], check=False)

