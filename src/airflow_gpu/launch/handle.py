"""What a launcher returns for each started replica: its log lines, exit code and a stop."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Protocol


class LaunchError(RuntimeError):
    """A replica could not start; the message says why and what to change."""


def signal_of(name: str | None) -> signal.Signals:
    """The signal a stop sends first: a name ("SIGUSR1", "USR1"); None: SIGTERM."""
    if name is None:
        return signal.SIGTERM
    key = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
    try:
        return signal.Signals[key]
    except KeyError:
        raise ValueError(f"stop signal {name!r} is not a signal name (e.g. SIGTERM, "
                         "SIGUSR1, SIGINT)") from None


class Handle(Protocol):
    name: str                       # role-index, the prefix of its log lines
    killed: bool                    # a stop sent SIGKILL: it outlived the grace

    def lines(self) -> Iterator[str]: ...   # until the replica's output ends

    def wait(self) -> int: ...              # exit code

    # stop it (idempotent) and free what it used: `sig` (a signal name; None: SIGTERM),
    # SIGKILL after `grace` seconds (None: the runner's default)
    def stop(self, grace: float | None = None, sig: str | None = None) -> None: ...
