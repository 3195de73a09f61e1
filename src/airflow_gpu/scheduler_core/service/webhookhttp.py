"""One webhook POST under one deadline: connecting, sending and reading the answer all end
by it, however the receiver dribbles its bytes (httpx's own timeouts bound each read,
not the whole request: a byte every few seconds would hold a sender for ever). Of the
answer only the status counts: at most MAX_ANSWER bytes of its body are read, the rest
never leaves the receiver's socket.

The deadline lives in the network streams under httpx (an httpcore backend), set per
attempt on the sending thread: httpx's sync client does all its I/O on the caller's
thread. Requests go straight to the receiver (no HTTP(S)_PROXY from the environment)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpcore
import httpx

MAX_ANSWER = 4096        # bytes of an answer's body read at most
READ = 4096              # bytes one read takes off the socket at most
WRITE = 16384


class Deadline(threading.local):
    """When the attempt of this thread must be over (time.monotonic()); None: no bound."""

    at: float | None = None

    def left(self, timeout: float | None, error: type[Exception]) -> float | None:
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise error("the attempt took longer than its deadline")
        return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline):
        self.inner, self.deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(min(max_bytes, READ),
                               self.deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for i in range(0, len(buffer), WRITE):      # the deadline checked between parts
            self.inner.write(buffer[i:i + WRITE],
                             self.deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _Stream(self.inner.start_tls(
            ssl_context, server_hostname, self.deadline.left(timeout,
                                                             httpcore.ConnectTimeout)),
            self.deadline)

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, deadline: Deadline):
        self.inner, self.deadline = httpcore.SyncBackend(), deadline

    def connect_tcp(self, host, port, timeout=None, local_address=None,
                    socket_options=None):
        return _Stream(self.inner.connect_tcp(
            host, port, self.deadline.left(timeout, httpcore.ConnectTimeout),
            local_address, socket_options), self.deadline)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.UnsupportedProtocol("webhooks are sent over TCP")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    """httpx's transport on a pool whose streams keep the deadline."""

    def __init__(self, deadline: Deadline):
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), network_backend=_Backend(deadline),
            max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)


@dataclass
class Answer:
    status: int
    reason: str


class Sender:
    """POSTs, each bounded by its own deadline; shared by the sender threads."""

    def __init__(self, headers: dict[str, str]):
        self.deadline = Deadline()
        self.client = httpx.Client(transport=_Transport(self.deadline),
                                   follow_redirects=False, headers=headers,
                                   trust_env=False)

    def post(self, url: str, body: bytes, headers: dict[str, str],
             seconds: float) -> Answer:
        """POST `body` to `url`, all of it within `seconds`; httpx.HTTPError when no answer
        came in time (httpx.TimeoutException) or the connection failed."""
        self.deadline.at = time.monotonic() + seconds
        try:
            with self.client.stream("POST", url, content=body, headers=headers,
                                    timeout=seconds) as r:
                answer = Answer(r.status_code, r.reason_phrase)
                read = 0
                try:         # a little of the body, so a short answer keeps the connection
                    for chunk in r.iter_raw(READ):
                        read += len(chunk)
                        if read >= MAX_ANSWER:
                            break          # closing drops the connection and the rest
                except httpx.HTTPError:
                    pass                   # the status is the answer
                return answer
        finally:
            self.deadline.at = None

    def close(self) -> None:
        self.client.close()
