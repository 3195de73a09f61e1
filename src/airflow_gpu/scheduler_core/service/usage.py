"""Fair share's usage of ended jobs as running totals: each account's (a team, or a user
of a team: policy/types.account) decayed GPU-seconds as of the last read, decayed to the
pass's time and topped up with the jobs that ended since, instead of every pass
re-reading every job that ended in the last five half-lives (thousands of rows on a busy
cluster)."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..policy.types import account
from ..store.models import JobRow
from .common import ENDED, _ts, spec_gpus

# A job that ended (finished_at) this long before a read but committed after it is still
# found by the next read: the overlap each read keeps, its jobs counted once by id.
MARGIN = 300.0


class EndedUsage:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.half_life: float | None = None
        self.at: float | None = None               # the totals' time
        self.usage: dict[str, float] = {}          # account -> decayed GPU-seconds at `at`
        self.recent: dict[str, float] = {}         # job id -> its end, within MARGIN of `at`

    def add_to(self, s: Session, fairshare, t_now: float, half_life: float) -> None:
        """Add every ended job's decayed usage, as of `t_now`, to `fairshare`."""
        with self._lock:
            if half_life != self.half_life or self.at is None or t_now < self.at:
                self._reset(half_life, t_now - 5 * half_life)   # what is older is ~0
            self._read(s, t_now)
            for acct, used in self.usage.items():
                fairshare.usage[acct] = fairshare.usage.get(acct, 0.0) + used

    def _reset(self, half_life: float, since: float) -> None:
        self.half_life, self.at, self.usage, self.recent = half_life, since, {}, {}

    def _read(self, s: Session, t_now: float) -> None:
        h = self.half_life
        decay = 2.0 ** (-(t_now - self.at) / h)
        usage = {acct: used * decay for acct, used in self.usage.items()}
        # Columns, not rows: a row this session already holds would come back with its
        # old values (a job cancelled since it was read still shows no finished_at).
        for job_id, team, user, spec, admitted_at, finished_at in s.execute(select(
                JobRow.id, JobRow.team, JobRow.user, JobRow.spec, JobRow.admitted_at,
                JobRow.finished_at).where(
                JobRow.state.in_(ENDED), JobRow.admitted_at.is_not(None),
                JobRow.finished_at > datetime.fromtimestamp(self.at - MARGIN, UTC))):
            if job_id in self.recent:
                continue
            start, end = _ts(admitted_at), _ts(finished_at)
            self.recent[job_id] = end
            ago_end, ago_start = max(0.0, t_now - end), max(0.0, t_now - start)
            acct = account(team, user)
            usage[acct] = usage.get(acct, 0.0) + spec_gpus(spec) * h / math.log(2) * (
                2.0 ** (-ago_end / h) - 2.0 ** (-ago_start / h))
        self.usage, self.at = usage, t_now
        self.recent = {j: end for j, end in self.recent.items() if end > t_now - MARGIN}
