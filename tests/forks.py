"""Test processes that start from a fork of one that has done its imports already: each
is still a process of its own (its pid, signals and exit status as `subprocess` gives
them), but skips the CPU a fresh interpreter spends on imports, hundreds of times a run.
One fork server per test process and kind (`python -m tests.forks SOCKET KIND`), its
environment the one it was started with:

- `airflow`: `dag.test()` runs (`airflow_gpu.demo --dag-test`), for the e2e tests. It has
  imported Airflow and the provider (~5 s of CPU) and built Airflow's in-process Execution
  API, whose versioned routes take ~4.5 s more on a run's first request, and frozen its
  heap (`gc.freeze()`), which the collection at exit walked for ~3.5 s: a run is ~1 s.
- `cli`: `airflow-gpu ...` (`airflow_gpu.cli.main`), for the servers the tests start
  (tests/servers.py): ~1.4 CPU-s to start a server, ~0.3 forked.

A request is one JSON line on a Unix socket with the child's stdout and stderr as attached
file descriptors; the answer is the child's pid, then, when it ends, its exit status as
`subprocess` gives it (negative: the signal that ended it)."""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

PRELOAD = {
    "airflow": ("airflow", "airflow.sdk", "airflow.sdk.execution_time.supervisor",
                "airflow.sdk.execution_time.task_runner",
                "airflow.api_fastapi.execution_api.app", "airflow.models.dagrun",
                "airflow.models.xcom", "airflow_gpu.operators", "airflow_gpu.triggers.admission",
                "airflow_gpu.decorators", "airflow_gpu.demo.dagtest", "docker",
                "airflow.models.dagbag", "airflow.dag_processing.dagbag",
                "airflow.providers.standard.operators.python",
                "airflow.providers.standard.decorators.python",
                "airflow.models.renderedtifields"),
    "cli": ("airflow_gpu.cli.main", "airflow_gpu.cli.commands.server_command",
            "airflow_gpu.scheduler_core.api.app", "airflow_gpu.scheduler_core.service.loop",
            "airflow_gpu.scheduler_core.store.db", "uvicorn", "uvicorn.main",
            "uvicorn.protocols.http.h11_impl", "uvicorn.lifespan.on", "psycopg",
            "sqlalchemy.dialects.postgresql.psycopg", "sqlalchemy.dialects.sqlite", "alembic",
            "alembic.command", "prometheus_client"),
}
# what a module reads from the environment as it is imported: a request whose values
# differ cannot be forked (the provider's `[gpu_scheduler]` options are read when used)
IMPORT_TIME_ENV = ("AIRFLOW_HOME", "PYTHONPATH", "AIRFLOW_GPU_CGROUP_ROOT")


def warm_execution_api() -> None:
    """Build the Execution API app `dag.test()` serves its task runs from, routes and
    all, as its first request would (one per process, cached by Airflow)."""
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    app = in_process_api_server().app
    if not getattr(app, "_cadwyn_initialized", True):   # Cadwyn builds them lazily
        app._cadwyn_initialize()


def forkable(env: dict[str, str], server_env: dict[str, str]) -> bool:
    """Whether a child with `env` may be forked from a server started with `server_env`:
    what the imports read is the same (Airflow's settings, the variables above)."""
    def fixed(e):
        return {k: v for k, v in e.items() if (k.startswith("AIRFLOW__") or k in
                IMPORT_TIME_ENV) and not k.startswith("AIRFLOW__GPU_SCHEDULER__")}
    return fixed(env) == fixed(server_env)


def exit_status(e: SystemExit) -> int:
    """The status Python exits with for `e`: its code, 0 for none, else 1 (a message is
    printed on stderr)."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def _run(req: dict) -> int:
    if req["target"] == "dag-test":
        from airflow_gpu.demo.dagtest import dag_test

        sys.argv = ["airflow_gpu.demo", "--dag-test", *req["args"]]
        return dag_test(*req["args"])
    from airflow_gpu.cli.main import main

    sys.argv = ["airflow-gpu", *req["args"]]
    return main(req["args"])


def _child(req: dict, out_fd: int, err_fd: int) -> None:
    """In the forked child: become the run that `req` describes, then exit as it ends."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {out_fd, err_fd, null}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    code = 1
    try:
        code = _run(req)
    except SystemExit as e:
        code = exit_status(e)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    raise SystemExit(code)


def _report_exit(conn: socket.socket, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        conn.sendall(f"{code}\n".encode())
    finally:
        conn.close()


def serve(path: str, kind: str) -> None:
    for name in PRELOAD[kind]:
        importlib.import_module(name)
    if kind == "airflow":
        warm_execution_api()
    if threading.active_count() != 1:      # forking with threads alive is unsafe
        raise SystemExit(f"imports started {threading.active_count() - 1} threads")
    # what the imports made stays out of the children's collections, the last one at exit
    # too: it walked Airflow's whole heap, ~3.5 s of CPU at the end of every run
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    null = os.open(os.devnull, os.O_WRONLY)   # nobody reads this server's output from now on
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    while True:
        conn, _ = listener.accept()
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            _child(json.loads(msg), fds[0], fds[-1])
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        threading.Thread(target=_report_exit, args=(conn, pid), daemon=True).start()


class Forked:
    """A forked run with the part of `subprocess.Popen` the tests use."""

    def __init__(self, path: str, req: dict, stdout: int | None = None,
                 stderr: int | None = None):
        """`stdout`, `stderr`: file descriptors for the child's; without them both go to a
        pipe that `communicate()` reads."""
        read = None
        if stdout is None:
            read, stdout = os.pipe()
            stderr = stdout
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(path)
        socket.send_fds(self.conn, [json.dumps(req).encode()], [stdout, stderr])
        if read is not None:
            os.close(stdout)
        self._out, self._buf, self.returncode = read, b"", None
        self.pid = int(self._line(30))

    def _line(self, timeout: float | None) -> bytes | None:
        """The server's next line, or None when none came within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return None
            chunk = self.conn.recv(64)
            if not chunk:
                raise RuntimeError("the fork server went away")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
            self.returncode = int(line)
            self.conn.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        deadline, chunks = time.monotonic() + (timeout or 1e9), []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._out], [], [], left)[0]:
                    raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
                chunk = os.read(self._out, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            output = b"".join(chunks).decode(errors="replace")
        os.close(self._out)
        self.wait(max(1.0, deadline - time.monotonic()))
        return output, None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """The fork server of one test process and `kind`, for the environment `env`."""

    def __init__(self, env: dict[str, str], cwd: str, sock: str, kind: str = "airflow"):
        self.env, self.cwd, self.path = env, cwd, sock
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forks", sock, kind],
                                     cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        lines = []                          # Airflow may log before it is ready
        while not lines or lines[-1] not in ("ready\n", ""):
            lines.append(self.proc.stdout.readline())
        if lines[-1] != "ready\n":
            self.proc.kill()
            raise RuntimeError(f"the {kind} fork server did not start: " + "".join(lines))

    def start(self, args: list[str], env: dict[str, str]):
        """A run of `airflow_gpu.demo --dag-test ARGS`, its output in one pipe."""
        return self._spawn("dag-test", ["airflow_gpu.demo", "--dag-test"], args, env)

    def cli(self, args: list[str], stdout: int, stderr: int):
        """`airflow-gpu ARGS` with this process's environment."""
        return self._spawn("cli", ["airflow_gpu.cli"], args, dict(os.environ), stdout,
                           stderr)

    def _spawn(self, target: str, module: list[str], args: list[str], env: dict[str, str],
               stdout: int | None = None, stderr: int | None = None):
        """Forked where `env` allows (without `stdout`: stdout and stderr in one pipe),
        else a fresh `python -m MODULE ARGS`."""
        if forkable(env, self.env) and self.proc.poll() is None:
            return Forked(self.path, {"target": target, "args": args, "env": env,
                                      "cwd": self.cwd}, stdout, stderr)
        pipe = stdout is None
        return subprocess.Popen([sys.executable, "-m", *module, *args], cwd=self.cwd,
                                env=env, text=pipe,
                                stdout=subprocess.PIPE if pipe else stdout,
                                stderr=subprocess.STDOUT if pipe else stderr)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


_cli_server: ForkServer | None = None


def cli_forks(cwd: str) -> ForkServer:
    """This test process's `cli` fork server, started on first use, stopped at exit."""
    global _cli_server
    if _cli_server is None or _cli_server.proc.poll() is not None:
        sock = os.path.join(tempfile.mkdtemp(prefix="airflow-gpu-forks-"), "cli.sock")
        _cli_server = ForkServer(dict(os.environ), cwd, sock, kind="cli")
        atexit.register(_cli_server.stop)
    return _cli_server


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
