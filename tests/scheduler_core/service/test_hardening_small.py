"""Smaller hardening, on real servers with SQLite and PostgreSQL: batches that share
idempotency keys and arrive at once are never a 500; a SQLite file the server could not
write (immutable, or read-only for its user) stops the start in one line naming it and the
fix; every time the API answers carries its UTC offset; a 413 closes the connection
instead of reading the rest of the body."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import DateTime, func, select
from sqlalchemy.exc import IntegrityError

from airflow_gpu.scheduler_core.api.bodies import MAX_BODY
from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.service import batch
from airflow_gpu.scheduler_core.service.auth import create_token
from airflow_gpu.scheduler_core.store.db import make_engine, open_database, sessions, upgrade
from airflow_gpu.scheduler_core.store.models import Base, JobRow, UtcDateTime
from airflow_gpu.scheduler_core.store.sqlitefiles import check_writable
from tests.helpers import REPO
from tests.scheduler_core.api.test_api import auth, spec, submit
from tests.servers import Server, prepared

CLUSTER = {"hosts": [{"name": "dgx-1", "model": "dgx-a100"},
                     {"name": "dgx-2", "model": "dgx-a100"}]}


@pytest.fixture
def live(db_url, tmp_path):
    """`airflow-gpu server` in a process of its own (a real socket), with a team token."""
    engine, token, cluster = prepared(db_url, tmp_path, CLUSTER, "nlp")
    server = Server(db_url, cluster, log=tmp_path / "server.log")
    server.token, server.engine = token, engine
    yield server
    server.stop()
    engine.dispose()


# -- batches that share idempotency keys, at once ----------------------------------------

def _batch(keys: list[int]) -> dict:
    return {"jobs": [{"spec": spec(f"j{k}", 1), "idempotency_key": f"k{k}"} for k in keys]}


def test_overlapping_batches_at_once_are_never_a_500_and_create_each_key_once(live):
    """Three batches at once per round: keys 0-39, 20-59 reversed and 0-39 reversed. On
    PostgreSQL the second inserter of a shared key waited for the first and failed on it
    (or the two waited on each other: a deadlock), and the batch answered 500."""
    answers: list[tuple[list[int], httpx.Response]] = []
    lock = threading.Lock()
    client = httpx.Client(base_url=live.url, timeout=120,
                          headers={"Authorization": f"Bearer {live.token}"})

    def post(keys: list[int], start: threading.Barrier) -> None:
        start.wait()
        r = client.post("/api/v1/jobs/batch", json=_batch(keys))
        with lock:
            answers.append((keys, r))

    for base in range(0, 20_000, 1000):            # 20 rounds
        a, b = list(range(base, base + 40)), list(range(base + 20, base + 60))[::-1]
        start = threading.Barrier(3)
        threads = [threading.Thread(target=post, args=(keys, start))
                   for keys in (a, b, a[::-1])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
    client.close()
    codes = sorted(r.status_code for _, r in answers)
    assert len(codes) == 60 and set(codes) <= {200, 201, 409}, [
        (r.status_code, r.text[:300]) for _, r in answers if r.status_code >= 500][:3]
    for _, r in answers:
        if r.status_code == 409:        # only once a key collided on every try: named
            assert "idempotency_key" in r.json()["detail"], r.text
    # each key is one job, and every batch that answered names that job
    with live.engine.connect() as conn:
        per_key = dict(conn.execute(select(JobRow.idempotency_key, func.count())
                                    .group_by(JobRow.idempotency_key)).all())
        ids = dict(conn.execute(select(JobRow.idempotency_key, JobRow.id)).all())
    assert len(per_key) == 20 * 60 and set(per_key.values()) == {1}
    for keys, r in answers:
        if r.status_code in (200, 201):
            assert [j["id"] for j in r.json()] == [ids[f"k{k}"] for k in keys]


def test_a_key_that_collided_on_every_try_is_named_in_the_409(api):
    """What the 409 says once every try met a concurrent insert of the same key: the
    job of the batch by index and name, and the key (PostgreSQL names it; SQLite
    serialises writers, so there it names the batch)."""
    service = api.service
    first = api.post("/api/v1/jobs", headers=auth(api, "vision"),
                     json={"spec": spec("b", 1), "idempotency_key": "kb"})
    assert first.status_code == 201, first.text
    specs = [JobSpec.model_validate(spec(n, 1)) for n in ("a", "b")]
    rows = [JobRow(id=f"id-{n}", team="vision", idempotency_key=f"k{n}", name=n)
            for n in ("a", "b")]
    clash = JobRow(id="id-x", name="b", team="vision", idempotency_key="kb", spec={},
                   state="pending", submitted_at=datetime.now(UTC))
    with pytest.raises(IntegrityError) as caught, service.sessions.begin() as s:
        s.add(clash)
    said = batch._collided(caught.value, rows, specs)
    if service.engine.dialect.name == "postgresql":
        assert said.startswith("jobs[1] (name 'b'): idempotency_key 'kb' was being "
                               "submitted by another request at the same time"), said
    else:
        assert said.startswith("jobs: other requests were submitting the same "
                               "idempotency keys at the same time"), said
    assert "send the batch again" in said


# -- a SQLite file the server cannot write ------------------------------------------------

def _chattr(flag: str, *paths: Path) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True, capture_output=True)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_gpu.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def left_behind(tmp_path):
    """A SQLite database as a killed server leaves it: the file, its -wal and its -shm."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    try:                             # root ignores chmod: the immutable flag stops it
        _chattr("+i", probe)
        _chattr("-i", probe)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"chattr +i does not work on {tmp_path} ({e}); tmpfs has no such flag")
    # a folder other users may reach (pytest's tmp_path is root's alone)
    folder = Path(tempfile.mkdtemp(prefix="airflow-gpu-test-"))
    folder.chmod(0o755)
    db = folder / "gpu.db"
    cluster = folder / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    try:
        server = Server(f"sqlite:///{db}", cluster, log=folder / "server.log")
        server.kill()
        files = [db, db.with_name("gpu.db-wal"), db.with_name("gpu.db-shm")]
        assert all(f.is_file() for f in files), list(folder.iterdir())
        yield db, cluster, files
    finally:
        _chattr("-i", *folder.iterdir())
        shutil.rmtree(folder)


def test_an_immutable_sqlite_file_stops_the_start_in_one_line_naming_it(left_behind):
    """Immutable, the -shm kills a running server with SIGBUS at its next write; the start
    refuses it in one line with `chattr -i FILE`, exit 2. The -wal and the file itself
    likewise (every command that opens the database checks them), and append-only."""
    db, cluster, files = left_behind
    url = f"sqlite:///{db}"
    _chattr("+i", files[2])
    out = _cli("server", "--db", url, "--cluster", str(cluster), "--port", "0")
    _chattr("-i", files[2])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr)
    assert lines[0] == (
        f"error: --db: the SQLite file '{files[2]}' is immutable (chattr +i); SQLite must "
        f"write it (a server would die on it with SIGBUS); run `chattr -i {files[2]}`, "
        "then start again"), lines[0]
    for path, flag in ((files[1], "i"), (files[0], "i"), (files[2], "a")):
        _chattr(f"+{flag}", path)
        try:
            with pytest.raises(InputError) as said:
                open_database(url)
        finally:
            _chattr(f"-{flag}", path)
        assert f"the SQLite file '{path}' is " in str(said.value)
        assert f"run `chattr -{flag} {path}`" in str(said.value)
    open_database(url).dispose()                 # once fixed, it opens


def test_a_shm_made_immutable_while_the_server_runs_leaves_a_line(left_behind):
    """SQLite writes -shm through a memory map: made immutable under a running server,
    the next write kills it with SIGBUS, which no Python code can catch. The server
    reports it on stderr (faulthandler) instead of vanishing without a line."""
    db, cluster, files = left_behind
    engine = make_engine(f"sqlite:///{db}")
    token = create_token(sessions(engine), "nlp")
    engine.dispose()
    log = db.with_name("running.log")
    server = Server(f"sqlite:///{db}", cluster, log=log, interval=0.1)
    try:
        _chattr("+i", files[2])
        end = time.monotonic() + 60
        while server.proc.poll() is None:       # a submit writes
            assert time.monotonic() < end, "the server still runs 60 s later"
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"{server.url}/api/v1/jobs", timeout=5, json={
                    "spec": spec("a", 1)}, headers={"Authorization": f"Bearer {token}"})
            time.sleep(0.1)
    finally:
        _chattr("-i", files[2])
        server.stop()
    assert server.proc.returncode == -7, server.proc.returncode        # SIGBUS
    assert "Fatal Python error: Bus error" in log.read_text(), log.read_text()[-2000:]


def test_a_read_only_shm_stops_the_start_for_its_user_and_not_for_root(left_behind):
    """chmod 0444: root writes it anyway (the check lets root start), another user's
    SQLite cannot write through it ("attempt to write a readonly database"), so for that
    user the start stops, naming the file."""
    db, _, files = left_behind
    shm = files[2]
    for f in files[:2]:
        f.chmod(0o666)
    db.parent.chmod(0o777)
    shm.chmod(0o444)
    if os.getuid() != 0:
        pytest.skip("needs root: to show that root writes a 0444 file and to become "
                    "another user")
    check_writable(db)                            # root: nothing to refuse
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child, as nobody
        try:
            said = []
            try:
                os.setgid(65534)
                os.setuid(65534)
                try:
                    check_writable(db)
                    said.append("check: passed")
                except InputError as e:
                    said.append(f"check: {e}")
                conn = sqlite3.connect(db, timeout=5)
                try:
                    conn.execute("INSERT INTO teams (name) VALUES ('x')")
                    conn.commit()
                    said.append("sqlite: wrote")
                except sqlite3.Error as e:
                    said.append(f"sqlite: {e}")
            except BaseException as e:  # noqa: BLE001 (reported to the parent)
                said.append(f"child: {e!r}")
            os.write(write, "\n".join(said).encode())
        finally:
            os._exit(0)
    os.close(write)
    end = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > end:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the check as another user did not end within 60 s")
        time.sleep(0.05)
    with os.fdopen(read) as got:
        said = got.read().splitlines()
    assert len(said) == 2, said
    check, wrote = said
    assert wrote == "sqlite: attempt to write a readonly database", wrote
    assert check == (f"check: --db: the SQLite file '{shm}' is not writable by this user "
                     f"(uid 65534); SQLite must write it; make it writable (chown or `chmod "
                     f"u+w {shm}`) or run as its owner, then start again"), check


# -- times carry their offset -------------------------------------------------------------

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
OFFSET = re.compile(r"(Z|[+-]\d{2}:?\d{2})$")


def _times(value, path: str, out: dict[str, str]) -> None:
    """Every string in an answer that reads as a time, by its path (list indexes as [])."""
    if isinstance(value, dict):
        for k, v in value.items():
            _times(v, f"{path}.{k}", out)
    elif isinstance(value, list):
        for v in value:
            _times(v, f"{path}[]", out)
    elif isinstance(value, str) and ISO.match(value):
        out[path] = value


def test_every_time_in_the_api_carries_an_offset(api):
    """Jobs, queue, explain (events), usage, cluster (hosts), accounting and tokens, with a
    job that ran and one that finished, reported and drained hosts: every time has an
    offset. SQLite gave naive times back, and the API answered them without one."""
    a = submit(api, "vision", spec("a", 2)).json()
    b = submit(api, "vision", spec("b", 1)).json()
    api.tick()
    for j in (a, b):
        assert api.post(f"/api/v1/jobs/{j['id']}/heartbeat",
                        headers=auth(api, "vision")).status_code == 200
    host = api.get(f"/api/v1/jobs/{a['id']}", headers=auth(api, "vision")).json()[
        "replicas"][0]["host"]
    for _ in range(2):
        r = api.post(f"/api/v1/hosts/{host}/report", headers=auth(api, "admin"), json={
            "gpus": [{"index": i, "healthy": True, "utilization_gpu": 50.0,
                      "power_watts": 100.0} for i in range(8)]})
        assert r.status_code == 200, r.text
    api.post(f"/api/v1/jobs/{b['id']}/finish", headers=auth(api, "vision"),
             json={"outcome": "succeeded", "exit_code": 0})
    other = "dgx-2" if host == "dgx-1" else "dgx-1"
    api.post(f"/api/v1/hosts/{other}/drain", headers=auth(api, "admin"),
             json={"reason": "maintenance"})
    r = api.post("/api/v1/tokens", headers=auth(api, "admin"),
                 json={"team": "vision", "expires_in": 3600})
    assert r.status_code == 201, r.text
    seen: dict[str, str] = {}
    for path in ("/api/v1/jobs", f"/api/v1/jobs/{a['id']}", f"/api/v1/jobs/{b['id']}",
                 f"/api/v1/jobs/{a['id']}/explain", f"/api/v1/jobs/{a['id']}/usage",
                 "/api/v1/queue", "/api/v1/cluster", "/api/v1/accounting",
                 "/api/v1/tokens", "/api/v1/teams"):
        r = api.get(path, headers=auth(api, "admin"))
        assert r.status_code == 200, (path, r.text)
        _times(r.json(), path.replace(a["id"], "A").replace(b["id"], "B"), seen)
    naive = {p: t for p, t in seen.items() if not OFFSET.search(t)}
    assert naive == {}, naive
    for field in ("/api/v1/jobs[].submitted_at", "/api/v1/jobs[].admitted_at",
                  "/api/v1/jobs[].started_at", "/api/v1/jobs[].lease_expires_at",
                  "/api/v1/jobs/B.finished_at", "/api/v1/jobs/A.replicas[].granted_at",
                  "/api/v1/jobs/A/explain.events[].at", "/api/v1/jobs/A/usage.series[].at",
                  "/api/v1/queue[].submitted_at", "/api/v1/cluster.hosts[].drained_at",
                  "/api/v1/cluster.hosts[].last_report_at",
                  "/api/v1/accounting.rows[].submitted_at", "/api/v1/tokens[].created_at",
                  "/api/v1/tokens[].expires_at"):
        assert field in seen, (field, sorted(seen))


def test_every_time_column_reads_back_as_utc(db_url):
    """The store's one place for it: every DateTime column is a UtcDateTime, and a time
    written with another offset reads back as the same instant in UTC (PostgreSQL in a
    session of another zone, too)."""
    loose = [f"{t.name}.{c.name}" for t in Base.metadata.tables.values()
             for c in t.columns if isinstance(c.type, DateTime)]   # not a UtcDateTime
    assert any(isinstance(c.type, UtcDateTime) for c in JobRow.__table__.columns)
    assert loose == [], f"time columns without UtcDateTime: {loose}"
    url = db_url
    if url.startswith("postgresql"):
        # answers in +05:30 unless converted
        url += ("%20" if "options=" in url else "?options=") + "-cTimeZone%3DAsia/Kolkata"
    engine = make_engine(url)
    upgrade(engine)
    at = datetime.fromisoformat("2026-03-01T10:00:00+02:00")
    with sessions(engine).begin() as s:
        s.add(JobRow(id="t", name="t", team="x", spec={}, state="pending",
                     submitted_at=at))
    with sessions(engine)() as s:
        got = s.scalars(select(JobRow.submitted_at)).one()
        latest = s.scalar(select(func.max(JobRow.submitted_at)))
    engine.dispose()
    assert got == at and got.tzinfo is UTC and got.isoformat() == "2026-03-01T08:00:00+00:00"
    assert latest == at and latest.tzinfo is UTC


# -- a 413 closes the connection ----------------------------------------------------------

def _response(sock: socket.socket, deadline: float) -> bytes:
    """The bytes of one response (headers and a Content-Length body)."""
    got = b""
    while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < int(
            re.search(rb"content-length: (\d+)", got, re.I).group(1)):
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        piece = sock.recv(65536)
        assert piece, f"the connection ended before the whole response: {got[:300]!r}"
        got += piece
    return got


def _closed_while_sending(sock: socket.socket, deadline: float) -> str | None:
    """Keep sending small chunks (a client with more body to send) until the server ends
    the connection (how, as a word), or None at the deadline."""
    while time.monotonic() < deadline:
        try:
            sock.sendall(b"400\r\n" + b" " * 1024 + b"\r\n")
            sock.settimeout(0.2)
            if sock.recv(4096) == b"":
                return "closed"
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
    return None


@pytest.mark.parametrize("how", ["chunked", "declared"])
def test_a_413_closes_the_connection_instead_of_reading_the_rest(live, how):
    """Over MAX_BODY, chunked (refused once the bytes pass the limit) or declared in
    Content-Length (refused before any is read): the 413 says `connection: close`, and the
    server ends the connection while the client still sends. It read the rest before,
    for as long as the client sent, to keep the connection for a next request."""
    head = (f"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            f"{live.token}\r\nContent-Type: application/json\r\n")
    with socket.create_connection(("127.0.0.1", live.port), timeout=30) as sock:
        if how == "chunked":
            sock.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
            piece = b"[" + b" " * (64 * 1024 - 1)
            sent = 0
            try:
                while sent <= MAX_BODY:       # the limit and one piece more
                    sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                    sent += len(piece)
            except (ConnectionResetError, BrokenPipeError):
                pass                        # it answered (and closed) while we sent
        else:
            sock.sendall(f"{head}Content-Length: {2 * MAX_BODY}\r\n\r\n".encode())
        deadline = time.monotonic() + 60
        response = _response(sock, deadline)
        status, headers = response.split(b"\r\n", 1)[0], response.split(b"\r\n\r\n")[0]
        assert status == b"HTTP/1.1 413 Request Entity Too Large", response[:300]
        assert b"over the limit of 1048576 bytes" in response
        ended = _closed_while_sending(sock, time.monotonic() + 30)
    assert ended is not None, "the server still read the body 30 s after its 413"
    assert re.search(rb"^connection: close\r?$", headers, re.I | re.M), headers
    # and the server serves the next client
    r = httpx.get(f"{live.url}/api/v1/jobs", timeout=30,
                  headers={"Authorization": f"Bearer {live.token}"})
    assert r.status_code == 200, r.text
