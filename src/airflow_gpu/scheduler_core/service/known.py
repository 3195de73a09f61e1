"""What the scheduling leader keeps of each pending and live job between passes
(warm.py): the columns the engine uses, its spec parsed once, and what it charges."""

from __future__ import annotations

import json

from ..jobclasses import Defaults, resolve
from ..jobspec import JobSpec
from ..store.models import JobRow
from .common import PENDING, _ts, spec_gpus

# the columns the leader keeps of each job (the spec is kept parsed)
COLUMNS = (JobRow.id, JobRow.rev, JobRow.state, JobRow.team, JobRow.user, JobRow.spec,
           JobRow.priority, JobRow.submitted_at, JobRow.queued_at, JobRow.requeue_reason,
           JobRow.preemptors, JobRow.promised_at, JobRow.reason_code, JobRow.reason,
           JobRow.details, JobRow.eta_at, JobRow.preempt_reason, JobRow.preempted_by,
           JobRow.admitted_at, JobRow.deadline_at, JobRow.yield_at, JobRow.borrowed,
           JobRow.preempt_deadline_at)
_FIELDS = tuple(c.key for c in COLUMNS if c.key != "spec")


class Known:
    """What the leader last read of one job: its columns (as a row: passerrors.py and
    preemption.py read them), its spec parsed once while its priority and time limit stay,
    and the GPUs fair share charges it."""

    __slots__ = (*_FIELDS, "spec", "key", "gpus", "seq", "_resolved")

    @classmethod
    def of(cls, row, old: Known | None) -> Known:
        k = cls()
        for f in _FIELDS:
            setattr(k, f, getattr(row, f))
        spec = row.spec if isinstance(row.spec, dict) else {}
        # the spec is parsed again when it changes (an update of its priority or time
        # limit, or a write behind the service's back)
        k.key = (row.priority, hash(json.dumps(spec, sort_keys=True, default=str)))
        same = old is not None and old.key == k.key
        k.spec = old.spec if same else spec
        k._resolved = old._resolved if same else None
        k.gpus = spec_gpus(spec)
        # among jobs queued at the same time, the order of their ids (as the store reads
        # them): the same order whichever pass submitted them to the engine
        k.seq = int.from_bytes(row.id.encode()[:40].ljust(40, b"\0"), "big")
        return k

    def parsed(self) -> JobSpec:
        if isinstance(self.spec, dict):      # parsed on first use, the dict let go
            self.spec = JobSpec.model_validate({**self.spec, "name": self.id})
        return self.spec

    def resolved(self, classes: dict, defaults: Defaults) -> JobSpec:
        """The spec with its class and the policy's defaults applied (what the engine
        queues), kept while they stay: a rebuild of the engine for the time model then
        resolves none of 50,000 specs again (most of a submit's cost)."""
        hit = self._resolved
        if hit is None or hit[0] is not classes or hit[1] != defaults:
            hit = self._resolved = (classes, defaults,
                                    resolve(self.parsed(), classes, defaults=defaults))
        return hit[2]

    def engine_key(self) -> tuple:
        """What the engine takes from the row: a change elsewhere (a heartbeat, the
        reason a pass wrote) leaves the engine as it is."""
        if self.state == PENDING:
            return (self.state, self.key, self.submitted_at, self.queued_at,
                    self.requeue_reason, self.preemptors, self.promised_at,
                    self.reason_code == "Preempting" and self.details.get("victims"))
        return (self.state, self.key, self.admitted_at, self.deadline_at, self.yield_at,
                self.borrowed, self.preemptors, self.preempted_by, self.preempt_deadline_at)

    def stop_at(self) -> float | None:
        """When the planner counts a live job stopped: its time limit, or its yield to a
        reservation (overrun.py) where that comes first."""
        at = [_ts(t) for t in (self.deadline_at, self.yield_at) if t is not None]
        return min(at) if at else None
