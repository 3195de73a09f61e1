"""One bash per page: the page's shell blocks run in it one after another, as a reader
types them into one terminal, so `export`, `cd` and servers started with `&` carry from
block to block. It runs in a scratch directory laid out like a checkout (the repo's
`.venv`, `examples`, `bench`, `dags_examples` and `../shared` reachable), with
`airflow-gpu` on PATH and a stand-in `nvidia-smi` (no GPU here)."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from airflow_gpu.demo.stack import free_port
from tests.helpers import PYTHONPATH, REPO, SHARED

HERE = Path(__file__).resolve().parent
LINKED = (".venv", "examples", "bench", "dags_examples", "scripts")
BLOCK_TIMEOUT = 180           # seconds for one block; a block past it fails
DONE = "__DOCS_BLOCK_DONE__"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `airflow-gpu server ... &`: the docs' servers listen on 8080; here each page gets a free port
SERVER_LINE = re.compile(r"^(?P<cmd>\s*\S*airflow-gpu server\b[^&]*?)\s*&\s*(?P<rest>#.*)?$")

# The ERR trap records every failing command of a block (as `set -e` would stop at),
# without ending the shell: the block fails, naming the command and its status.
PRELUDE = r"""
docs_wait_server() {  # until the server on $1 answers /healthz (the reader waits a second too)
  for _ in $(seq 600); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "$1/healthz" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "server at $1 did not answer in 60s" >&2; return 1
}
"""


class BlockFailed(AssertionError):
    pass


class Shell:
    """bash in a new session (its process group holds every server the page starts)."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="airflow-gpu-docs-"))
        self.cwd = self.tmp / "repo"
        self.cwd.mkdir()
        for name in LINKED:
            (self.cwd / name).symlink_to(REPO / name)
        if SHARED.exists():
            (self.tmp / "shared").symlink_to(SHARED)
        self.control = self.tmp / "control"
        self.control.mkdir()
        self.port = free_port()
        self.count = 0
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW_GPU_", "AIRFLOW__GPU_SCHEDULER", "ADMIN_TOKEN"))}
        bins = [str(HERE / "bin"), str(REPO / ".venv" / "bin")]
        env.update(PATH=os.pathsep.join([*bins, env.get("PATH", "")]), COLUMNS="120",
                   TERM="dumb", NO_COLOR="1", DOCS_TESTS=str(HERE), DOCS_PORT=str(self.port),
                   PYTHONPATH=PYTHONPATH)
        return env

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=self.cwd, env=self.env(), text=True,
            bufsize=1, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.send(PRELUDE)

    def send(self, text: str) -> None:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def rewrite(self, source: str) -> str:
        """The page's port 8080 becomes this page's free port; after a line that starts a
        server in the background, wait until it answers (a reader waits too)."""
        url = f"http://127.0.0.1:{self.port}"
        out = []
        for line in source.replace("\\\n", " ").splitlines():
            line = re.sub(r"(127\.0\.0\.1|localhost):8080\b", f"127.0.0.1:{self.port}", line)
            m = SERVER_LINE.match(line)
            if m:
                cmd = re.sub(r"--port\s+\d+", "", m.group("cmd"))
                cmd = re.sub(r"--host\s+\S+", "", cmd)
                out += [f"{cmd} --host 127.0.0.1 --port {self.port} &", f"docs_wait_server {url}"]
            else:
                out.append(line)
        return "\n".join(out) + "\n"

    def run(self, source: str, timeout: float = BLOCK_TIMEOUT) -> str:
        """Run one block; return what it printed (stdout and stderr, in order). A block
        with a failing command fails, naming the command and its exit status."""
        if self.proc is None:
            self.start()
        self.count += 1
        script = self.control / f"block-{self.count}.sh"
        out = self.control / f"block-{self.count}.out"
        script.write_text(self.rewrite(source))
        self.send(f"__failed=''\n"
                  f"trap '__failed+=\"$? $BASH_COMMAND\"$'\"'\"'\\n'\"'\"'' ERR\n"
                  f"source {script} > {out} 2>&1 < /dev/null\n"
                  f"trap - ERR\n"
                  f"printf '%s\\n' \"$__failed\" | grep -v '^[0-9]* source ' "
                  f"| sed '/^$/d;s/^/FAILED /'\n"
                  f"echo {DONE}")
        failed = self.read_until_done(timeout, out)
        printed = ANSI.sub("", out.read_text(errors="replace"))
        if failed:
            raise BlockFailed("a command of the block failed (exit status, command):\n"
                              + "\n".join(failed) + "\n--- the block printed:\n"
                              + tail(printed))
        return printed

    def read_until_done(self, timeout: float, out: Path) -> list[str]:
        """The shell's own lines (the block's output goes to `out`) up to the end mark,
        read unbuffered so that select() sees every line."""
        assert self.proc and self.proc.stdout
        fd, pending = self.proc.stdout.fileno(), b""
        end = time.monotonic() + timeout
        failed: list[str] = []
        while True:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.strip() == DONE:
                    return failed
                if text.startswith("FAILED "):
                    failed.append(text[len("FAILED "):])
            left = end - time.monotonic()
            if left <= 0:
                printed = out.read_text(errors="replace") if out.exists() else ""
                self.close()
                raise BlockFailed(f"the block did not finish in {timeout:g}s; it printed:\n"
                                  + tail(printed))
            ready, _, _ = select.select([fd], [], [], min(left, 1))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise BlockFailed("the page's shell exited (did a block run `exit`?)")
                pending += chunk

    def close(self) -> None:
        """End the shell and everything it started (servers, agents), then its files."""
        if self.proc is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=10)
                    time.sleep(0.5)   # servers of the group end after the shell
                except subprocess.TimeoutExpired:
                    continue
            self.proc = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])
