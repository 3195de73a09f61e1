"""The queue views (priority.py: squeue, sprio, sshare) on the replica that leads: its
engine's own order, read under its lock, instead of a scheduler built from every row for
each request (12 s at 50,000 pending). The views must show what the store holds when
asked (a job updated or submitted a moment ago is where the next pass puts it): when a
queued job's row changed since the leader's last pass read the store (or the policy
did), the view wakes the loop and waits for a pass that read after it was asked; where
no loop runs (passes run by hand) the caller builds the scheduler as before. A job gone
from the queue since (admitted, ended, held) is left out by the caller; the running
jobs' changes (starts, ends) move the fair share only by what they used since the pass."""

from __future__ import annotations

import time

from sqlalchemy import select

from ..store.models import JobRow
from .common import PENDING, schedulable

WAIT = 10.0          # seconds a view waits for the pass that brings the leader up to date


def leader_engine(svc):
    """The leader's scheduler, up to date with the store as asked (see the module's
    docstring), for the caller to read under `svc.state_lock`; None where this replica
    does not lead, or it is behind and no loop runs."""
    asked = time.monotonic()
    w = svc.warm
    if w is None or w.sched is None or w.done_mark is None:
        return None
    with svc.reads() as s:      # the jobs queued that changed since (few: not the
        changed = s.execute(select(JobRow.id, JobRow.rev).where(   # running ones' beats)
            JobRow.changed >= w.done_mark, JobRow.state == PENDING, schedulable())).all()
    policy = svc._policy()          # may read the store: not while holding the lock
    with svc.state_lock:
        behind = policy != w.policy or any(
            (k := w.jobs.get(i)) is None or k.rev != rev for i, rev in changed)
    if not behind:
        return w
    if not getattr(svc, "scheduling", False):
        return None
    svc.wake.set()
    until = asked + WAIT
    while time.monotonic() < until:
        w = svc.warm
        if w is not None and w.sched is not None and w.read_at >= asked:
            return w
        time.sleep(0.02)
    return None

