"""What `airflow-gpu run` shows: the pending reason on one line of stderr while the job
waits, why a job that ended before it started did, and the replicas' output on stdout."""

from __future__ import annotations

import shutil
import sys

from ...scheduler_core.client import ApiError
from ...scheduler_core.errors import InputError
from ...scheduler_core.reasonkey import reason_key
from ...scheduler_core.units import format_duration

PREFIX = "airflow-gpu run: "


class StatusLine:
    """The pending reason and ETA: one line on stderr, refreshed in place on a terminal
    when it changes; elsewhere (a log) a new line when its key changes (reason_key:
    code, blockers, placement; not a countdown)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.text: str | None = None
        self.key: tuple | None = None

    def show(self, text: str, key: tuple) -> None:
        if self.tty:
            if text != self.text:
                width = shutil.get_terminal_size().columns - 1
                self._write("\r\033[K" + text[:width])
        elif key != self.key:
            self._write(text + "\n")
        self.text, self.key = text, key

    def close(self) -> None:
        """End the refreshed line, so what follows starts on a line of its own."""
        if self.tty and self.text is not None:
            self._write("\n")
        self.text = self.key = None

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:
            pass


def pending_line(job: dict) -> tuple[str, tuple]:
    why = job.get("pending") or {}
    if job["state"] == "preempting":
        return f"{PREFIX}job {job['id'][:8]} is being preempted", reason_key(job)
    if not why.get("code"):
        return (f"{PREFIX}job {job['id'][:8]} pending: queued (the next scheduling pass "
                "places it)", reason_key(job))
    eta = why.get("eta_seconds")
    when = f" (ETA {format_duration(eta)})" if eta is not None else " (no ETA)"
    return (f"{PREFIX}job {job['id'][:8]} pending: {why['code']}: {why.get('reason') or ''}"
            f"{when}", reason_key(job))


class Output:
    """The replicas' lines on stdout; prefixed with `[role-index]` when there are several
    (srun --label)."""

    def __init__(self, label: bool):
        self.label = label

    def __call__(self, name: str, line: str) -> None:
        try:
            sys.stdout.write(f"[{name}] {line}\n" if self.label else f"{line}\n")
            sys.stdout.flush()
        except (OSError, ValueError):     # stdout closed (a pipe's reader went away)
            pass


def ended_why(client, job: dict) -> str:
    """Why a job ended before it started, as explain says it (`: DependencyNeverSatisfied:
    prep (1a2b3c4d) ended failed ...`), or nothing when it cannot be read."""
    try:
        why = client.explain(job["id"])
    except (ApiError, InputError):
        return ""
    return f": {why['code']}: {why['reason']}" if why.get("code") else ""
