"""The leader's check of what its engine holds against the store (warm.py): the live
allocations and the wrong hold rows (store/integrity.py), a slice of `SLICE` hosts at a
time. Read whole, the check took one pass 6.4 s with 45,000 jobs running on 8,192 hosts;
what `integrity.judge` decides on a row depends only on its host's rows, so slices add
up to the whole. A slice is due every CHECK_EVERY / slices seconds (the whole cluster
about every CHECK_EVERY), or less often where a slice takes over CHECK_SHARE of the
leader's time. The hosts with wrong rows are read again every pass while there are some
(a repair gives back what they held at once)."""

from __future__ import annotations

import math
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..store import integrity
from ..store.models import AllocationRow
from .common import LIVE

CHECK_EVERY = 60.0      # seconds to check every host once (at most)
CHECK_SHARE = 0.01      # of the leader's time, at most, for checks
SLICE = 256             # hosts a check reads


def check(s: Session, w, revs: dict[str, int]) -> tuple[list[integrity.Finding] | None,
                                                       str | None]:
    """Check the hosts due (the next slice, when its time came) and those with wrong rows,
    in the pass's snapshot `s`: the wrong rows of all hosts (those not read kept as the
    last check found them), and how the engine differs from the store, if it does.
    (None, None) when nothing is due."""
    began = time.monotonic()
    due = began - w.checked_at >= w.check_every
    hosts = {f.host for f in w.found}
    names = [h.name for h in w.cluster.hosts]
    if due and names:
        start = w.check_at if w.check_at < len(names) else 0
        hosts.update(names[start:start + SLICE])
        w.check_at = start + SLICE
    if not hosts:
        return None, None
    part = integrity.find(s, w.cluster, hosts=sorted(hosts))
    found = integrity.ordered([f for f in w.found if f.host not in hosts] + part)
    diverged = _diverged(s, w, revs, found, hosts)
    if due:
        w.checked_at = time.monotonic()
        slices = max(1, math.ceil(len(names) / SLICE))
        w.check_every = max(CHECK_EVERY / slices, (w.checked_at - began) / CHECK_SHARE)
    return found, diverged


def _diverged(s: Session, w, revs: dict[str, int], found: list[integrity.Finding],
              hosts: set[str]) -> str | None:
    """How the engine's holdings on `hosts` differ from the store's, for the jobs whose
    row the leader has seen as it is (a job that changed since is applied in this pass
    anyway)."""
    if {f.key for f in found} != {f.key for f in w.found}:
        return "the wrong hold rows changed"
    store: dict[str, set] = {}
    for job_id, host, gpus, cpus in s.connection().execute(select(       # Core rows
            AllocationRow.job_id, AllocationRow.host, AllocationRow.gpus, AllocationRow.cpus)
            .where(AllocationRow.live.is_(True), AllocationRow.host.in_(sorted(hosts)))):
        store.setdefault(job_id, set()).add((host, tuple(sorted(gpus)), tuple(sorted(cpus))))
    engine: dict[str, set] = {}
    for job_id, allocs in w.sched.state.allocations.items():
        for a in allocs:
            if a.host.name in hosts:
                engine.setdefault(job_id, set()).add(
                    (a.host.name, tuple(sorted(a.gpus)), tuple(sorted(a.cpus))))
    for job_id in store.keys() | engine.keys():
        k = w.jobs.get(job_id)
        if k is None or k.rev != revs.get(job_id) or k.state not in LIVE \
                or job_id in w.broken:
            continue
        if engine.get(job_id, set()) != store.get(job_id, set()):
            return f"job {job_id}'s allocations"
    for job_id in w.sched.state.allocations:   # one the leader knows but the store no
        if job_id not in revs and job_id not in w.jobs:     # longer lists (ended) is
            return f"job {job_id} holds resources in memory only"    # dropped this pass
    return None
