"""What a preempted job keeps and loses, in the replay.

A job running with locality factor f does 1/f seconds of its work (its trace duration,
at factor 1) per second. It checkpoints every `interval` seconds of its run, counted
from its start (the restart resumes from a checkpoint, so the count starts over). When
it is signalled it stops without checkpointing again (the conservative case: a job that
saves on SIGTERM loses less), and it holds its GPUs through its preempt grace.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.preempt import unsaved


@dataclass
class Run:
    """One admission of a job."""

    start: float
    factor: float                     # locality slowdown of its placement
    work: float                       # work left when it started (seconds at factor 1)
    gpus: int
    end: float                        # when it ends if nothing stops it
    checkpoint_interval: float | None = None   # its job class's (None: the replay's)
    signal: float | None = None       # when it was told to stop (preempted)


def stop(run: Run, now: float) -> tuple[float, float]:
    """(work left, seconds lost) of a run signalled at `run.signal` and gone at `now`:
    the time since its last checkpoint is run again, and the grace was spent stopping."""
    ran = run.signal - run.start
    saved = ran - unsaved(ran, run.checkpoint_interval)
    # saved < ran < work x factor: some work is always left
    left = max(run.work - saved / run.factor, 1e-3)
    return left, (ran - saved) + (now - run.signal)
