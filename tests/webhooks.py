"""A webhook receiver for the tests: a real HTTP server on 127.0.0.1 in a thread of the
test process, recording every POST, and the signature check a receiver makes."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from airflow_gpu.demo.stack import free_port
from airflow_gpu.scheduler_core.service.webhooks import verify
from tests.helpers import until


class Receiver:
    """POSTs to `url` are recorded as (headers by lower-case name, body bytes) in `got`;
    each is answered with the next status of `answers` (the last one from then on).
    `stop()` takes it down (connections are refused), `start()` brings it up again on
    the same port. While down it keeps the port bound without listening, so that no
    other test's server takes it meanwhile."""

    def __init__(self, answers: tuple[int, ...] = (200,), port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.answers = list(answers)
        self.got: list[tuple[dict, bytes]] = []
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
        """Whether each POST's signature checks with `secret`."""
        with self._lock:
            return [verify(secret, h.get("x-airflow-gpu-signature", ""), b)
                    for h, b in self.got]
