"""The launcher's side of a job's lease, shared by the Airflow operators and `airflow-gpu
run`: the heartbeat (which the scheduler answers with the job, so the launcher learns there
that it is preempted or taken back), how often to send it, and the service's times on this
machine's clocks."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from ..scheduler_core.client import ApiError, delivery_state
from ..scheduler_core.errors import InputError
from ..scheduler_core.jobclasses import STOP_GRACE, STOP_SLACK
from .handle import signal_of
from .supervise import Interrupted


def seconds_left(iso: str | None) -> float | None:
    """Seconds until a time the service sent (ISO 8601, UTC), by this machine's clock."""
    if not iso:
        return None
    at = datetime.fromisoformat(iso)
    if at.tzinfo is None:           # SQLite keeps UTC without the zone
        at = at.replace(tzinfo=UTC)
    return (at - datetime.now(UTC)).total_seconds()


def monotonic_at(iso: str | None) -> float | None:
    """A time the service sent, on time.monotonic()'s clock (None: none)."""
    left = seconds_left(iso)
    return None if left is None else time.monotonic() + left


def beat_interval(job: dict) -> float:
    """Seconds between heartbeats: a third of what is left of the lease, and at most half
    of the job's grace plus the service's slack, so that a stop (preemption, an overrun
    into a reservation) is heard while its grace runs, not after the service has requeued
    the job by force and given its GPUs away; 0.5 to 30."""
    left = seconds_left(job.get("lease_expires_at"))
    grace = job.get("stop_grace")
    heard = ((STOP_GRACE if grace is None else float(grace)) + STOP_SLACK) / 2
    return min(30.0, max(0.5, min(10.0 if left is None else left / 3, heard)))


class Lease:
    """Heartbeats for one launcher. `beat` extends the lease of one admission (`attempt`)
    and raises `Interrupted` when the scheduler took the job back ("pending": requeued;
    "ended": cancelled, lost, finished) or preempts it ("preempting", with the signal and
    grace for the replicas). What the launcher should know is logged once: the preemption
    (per admission) and the idle-GPU policy's flag (per flag), each with the webhook
    notifications the scheduler sent of it (`notified`)."""

    def __init__(self) -> None:
        self.preempt_logged: tuple | None = None
        self.idle_logged: str | None = None
        self.yield_logged: tuple | None = None
        self.notes_logged: set[str] = set()     # webhook deliveries told, by id

    def beat(self, client, job_id: str, attempt: int, log: logging.Logger) -> None:
        try:
            job = client.heartbeat(job_id, attempt)
        except ApiError as exc:
            if exc.status == 409:
                detail = str(exc.detail)
                requeued = "is pending" in detail or "admitted again" in detail
                raise Interrupted("pending" if requeued else "ended", detail) from None
            log.warning("heartbeat failed: %s", exc)
        except InputError as exc:          # the service restarts: the lease still runs
            log.warning("heartbeat failed: %s", exc)
        else:
            self.idle_warning(job, log, client)
            self.reservation_warning(job, log)
            if job.get("state") == "preempting":
                raise self.preempted(job, log, client)

    def idle_warning(self, job: dict, log: logging.Logger, client=None) -> None:
        """The idle-GPU policy flagged the job: say so once per flag."""
        flagged = job.get("idle_flagged_at")
        if flagged and self.idle_logged != flagged:
            self.idle_logged = flagged
            log.warning("GPU job %s: its GPUs have stayed idle since %s and the "
                        "scheduler flagged it (idle-GPU policy; see airflow-gpu "
                        "explain %s)", job["id"][:8], job.get("idle_since"), job["id"][:8])
            self.notified(client, job["id"], ("idle",), log)

    def reservation_warning(self, job: dict, log: logging.Logger) -> None:
        """An admin's reservation starts on the job's hosts before it is expected to end:
        say so once per reservation and start."""
        name, at = job.get("yield_reservation"), job.get("yield_at")
        if name and at and self.yield_logged != (name, at):
            self.yield_logged = (name, at)
            log.warning("GPU job %s: reservation %s starts on its host(s) at %s; if the "
                        "job still runs then, it is stopped (its class's signal and grace) "
                        "and requeued under the same id (airflow-gpu reserve show %s)",
                        job["id"][:8], name, at, name)

    def notified(self, client, job_id: str, kinds: tuple[str, ...],
                 log: logging.Logger) -> None:
        """Log the job's webhook notifications of `kinds` not logged yet, with their
        state (read once, where the launcher hears of what they tell); a service without
        notifications, or one that does not answer, logs nothing."""
        if client is None:
            return
        try:
            notes = client.notifications(job_id)
        except (ApiError, InputError):
            return
        for n in notes:
            if n["kind"] in kinds and n["delivery_id"] not in self.notes_logged:
                self.notes_logged.add(n["delivery_id"])
                log.info("GPU job %s: %s notification (%s) to %s, asked by its %s: %s",
                         job_id[:8], n["kind"], n["event"], n["url"], n["source"],
                         delivery_state(n))

    def preempted(self, job: dict, log: logging.Logger, client=None) -> Interrupted:
        """The scheduler preempts the job: what to send its replicas, and for how long
        they may save a checkpoint (never past the service's forced requeue)."""
        sig = job.get("preempt_signal")
        try:
            sig = signal_of(sig).name
        except ValueError as exc:
            log.warning("%s: sending SIGTERM instead", exc)
            sig = "SIGTERM"
        limits = [t for t in (job.get("preempt_grace"),
                              seconds_left(job.get("preempt_deadline_at"))) if t is not None]
        grace = max(0.0, min(limits)) if limits else None
        reason = job.get("preempt_reason") or "no reason given"
        if reason.startswith("preempted by job "):     # it names the job (service's words)
            cut = reason.find("); ")                   # its signal and grace: said below
            why = reason[:cut + 1] if cut > 0 else reason
        elif job.get("preempted_by"):
            why = f"preempted by job {job['preempted_by'][:8]} ({reason})"
        else:
            why = f"stopped: {reason}"
        if self.preempt_logged != (job["id"], job.get("attempt")):  # each beat repeats it
            self.preempt_logged = (job["id"], job.get("attempt"))
            after = "the default grace" if grace is None else f"{round(grace, 1):g}s"
            log.warning("%s: sending %s to all replicas, SIGKILL after %s; the job is "
                        "requeued under the same id and its replicas restart with "
                        "AIRFLOW_GPU_RESTARTED=1", why, sig, after)
            self.notified(client, job["id"], ("preemption",), log)
        return Interrupted("preempting", why, signal=sig, grace=grace)
