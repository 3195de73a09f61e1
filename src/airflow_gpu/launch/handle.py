"""What a launcher returns for each started replica: its log lines, exit code and a stop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class LaunchError(RuntimeError):
    """A replica could not start; the message says why and what to change."""


class Handle(Protocol):
    name: str                       # role-index, the prefix of its log lines

    def lines(self) -> Iterator[str]: ...   # until the replica's output ends

    def wait(self) -> int: ...              # exit code

    # stop it (idempotent) and free what it used: SIGTERM, SIGKILL after `grace` seconds
    # (None: the runner's default)
    def stop(self, grace: float | None = None) -> None: ...
