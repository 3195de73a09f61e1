"""Webhook receivers for the tests, real servers on 127.0.0.1 in threads of the test
process: `Receiver` records every POST (and checks signatures as a receiver does);
`Dribbler` answers one byte at a time, for ever; `BigAnswer` answers 200 with a body of
many MiB."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from airflow_gpu.demo.stack import free_port
from airflow_gpu.scheduler_core.service.webhooks import verify
from tests.helpers import until


class Receiver:
    """POSTs to `url` are recorded as (headers by lower-case name, body bytes) in `got`
(and the path each came to in `paths`);
    each is answered with the next status of `answers` (the last one from then on).
    `stop()` takes it down (connections are refused), `start()` brings it up again on
    the same port. While down it keeps the port bound without listening, so that no
    other test's server takes it meanwhile."""

    def __init__(self, answers: tuple[int, ...] = (200,), port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.answers = list(answers)
        self.got: list[tuple[dict, bytes]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._held = self._hold()

    def _hold(self) -> socket.socket:
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", self.port))
        return held

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):           # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.got.append(({k.lower(): v for k, v in self.headers.items()},
                                         body))
                    receiver.paths.append(self.path)
                    status = (receiver.answers.pop(0) if len(receiver.answers) > 1
                              else receiver.answers[0])
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler,
                                     bind_and_activate=False)
        server.socket.close()
        server.socket, self._held = self._held, None       # the port held while down
        server.server_name, server.server_port = "127.0.0.1", self.port
        server.server_activate()
        self._server = server
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            self._held = self._hold()

    def bodies(self) -> list[dict]:
        with self._lock:
            return [json.loads(b) for _, b in self.got]

    def wait(self, n: int, timeout: float = 20) -> list[dict]:
        """The bodies, once at least `n` have come."""
        until(lambda: len(self.got) >= n, f"{n} notifications at {self.url} (got "
              f"{len(self.got)})", timeout=timeout)
        return self.bodies()

    def signed_with(self, secret: str) -> list[bool]:
        """Whether each POST's signature checks with `secret` and the URL it came to."""
        base = f"http://127.0.0.1:{self.port}"
        with self._lock:
            return [verify(secret, h.get("x-airflow-gpu-signature", ""), b, base + path)
                    for (h, b), path in zip(self.got, self.paths, strict=True)]


class _Raw:
    """A TCP server on loopback that runs `serve(connection)` on a thread per connection,
    counting connections (`accepted`, `open`, `most_open`); stop() closes them all."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.accepted = self.open = self.most_open = 0
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
                self.most_open = max(self.most_open, self.open)
                self._conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)                 # the request (small: one read takes it)
            self.serve(conn)
        except OSError:
            pass
        finally:
            with self._lock:
                self.open -= 1
            conn.close()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


class Dribbler(_Raw):
    """Answers every request one byte every `every` seconds, a header that never ends."""

    def __init__(self, every: float = 0.2):
        self.every = every
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000
        for i in range(len(answer)):
            if self.stopped.wait(self.every):
                return
            conn.sendall(answer[i:i + 1])


class BigAnswer(_Raw):
    """Answers 200 with a body of `size` bytes, sent as fast as the reader takes them;
    `sent` counts the body bytes the sender's side took."""

    def __init__(self, size: int):
        self.size, self.sent = size, 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.size)
        chunk = b"x" * 65536
        while self.sent < self.size:
            self.sent += conn.send(chunk[:self.size - self.sent])
