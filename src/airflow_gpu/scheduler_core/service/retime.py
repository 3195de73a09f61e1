"""A changed time model taken in job by job. The learned time model (slowdown.py) changes
as jobs end; the jobs the engine holds were planned with the factors of when they came
in. Once it has changed and MODEL_EVERY has passed since the last change was taken in,
every job is taken out of the engine and in again, planned with the new factors, over the
passes that follow, in batches, for a share of each pass's time: all at once took one
pass about 10 s with 50,000 jobs on 8,192 hosts."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..policy.scheduler import Scheduler
from .common import LIVE, PENDING

# seconds between changes of the learned time model taken in: it changes as jobs end
# (every few seconds on a big cluster), and taking it in re-plans every job
MODEL_EVERY = 300.0
# the share of a pass's time (of the last pass's length, at least RETIME_MIN seconds)
# spent taking jobs out of the engine and in again for a changed time model, in batches
RETIME_SHARE, RETIME_MIN, RETIME_BATCH = 0.25, 0.02, 100


def retime(w, sched: Scheduler, version, todo: set[str], t_now: float, last_pass: float,
           again: Callable[[object, list | None], None]) -> None:
    """Take jobs out of the engine and in again (`again(known, what it held)`) so that
    they are planned with the new time model `version` (`w`: warm.py's Warm): the running
    first, then the queued, for RETIME_SHARE of `last_pass` (the last pass's seconds);
    `todo`: those read again this pass anyway. A running job keeps what it held."""
    if (not w.retime and version != w.tm_version
            and time.monotonic() - w.built_at >= MODEL_EVERY):
        w.tm_version, w.built_at = version, time.monotonic()
        live = [i for i, k in w.jobs.items() if k.state in LIVE]
        w.retime = [*live, *(i for i, k in w.jobs.items() if k.state == PENDING)][::-1]
    until = time.perf_counter() + max(RETIME_MIN, RETIME_SHARE * last_pass)
    while w.retime:                   # a batch at least, then while there is time
        for job_id in w.retime[-RETIME_BATCH:]:
            k = w.jobs.get(job_id)
            if k is None or job_id in todo or job_id in w.broken or job_id in w.failed:
                continue              # gone, read again this pass, or not in the engine
            held = None
            if k.state in LIVE:
                if job_id not in sched.running:
                    continue
                held = sched.state.allocations.get(job_id, [])
            elif job_id not in sched.queue:
                continue
            drop(sched, job_id, t_now)
            again(k, held)
        del w.retime[-RETIME_BATCH:]
        if time.perf_counter() >= until:
            break


def drop(sched: Scheduler, job_id: str, t_now: float) -> None:
    """A job out of the engine (what it held returns)."""
    if job_id in sched.queue or job_id in sched.running:
        sched.finish(job_id, t_now)
