"""The fair-share usage of the running jobs, kept between passes by the leader (warm.py).

A job that has held g GPUs since a adds g * H/ln2 * (1 - 2^-((t - a)/H)) decayed
GPU-seconds at time t (policy/fairshare.py). Summed over an account's running jobs that is
H/ln2 * (G - 2^-((t - t0)/H) * E), with G the sum of their g and E the sum of
g * 2^((a - t0)/H) for a fixed t0: two numbers per account, changed only when a job
starts, ends or is read again, instead of a walk of every running job in every pass
(45,000 on 8,192 hosts). t0 moves forward every half-life, so that no term grows large."""

from __future__ import annotations

import math

from ..policy.fairshare import FairShare
from ..policy.types import account
from .common import _ts


class LiveUse:
    def __init__(self, half_life: float, t0: float):
        self.half_life, self.t0 = half_life, t0
        self.jobs: dict[str, tuple] = {}     # id -> what it adds (_add)
        self.used: dict[str, list] = {}      # account -> [its jobs, G, E]
        self.charged: dict[str, list] = {}   # account -> [its jobs, GPUs charged]

    def sync(self, running: dict, known: dict, changed, t_now: float) -> None:
        """Bring the sums up to date with the engine's running jobs (`running`, id ->
        its job) and what is known of them (`known`: warm.py's Known): jobs started or
        ended since, and those read again (`changed`)."""
        if t_now - self.t0 > self.half_life:    # so that no term exceeds 2 g
            self.__init__(self.half_life, t_now)
        for job_id in self.jobs.keys() - running.keys():
            self._add(self.jobs.pop(job_id), -1)
        for job_id in (running.keys() - self.jobs.keys()) | (changed & running.keys()):
            old = self.jobs.pop(job_id, None)
            if old is not None:
                self._add(old, -1)
            job, k = running[job_id], known.get(job_id)
            if k is not None and k.admitted_at is not None:
                term = k.gpus * 2.0 ** ((min(_ts(k.admitted_at), t_now) - self.t0)
                                        / self.half_life)
                used = (account(k.team, k.user), k.gpus, term)
            else:                                 # charged, with no usage so far
                used = None
            entry = (used, job.account, job.charge)
            self.jobs[job_id] = entry
            self._add(entry, 1)

    def _add(self, entry: tuple, sign: int) -> None:
        used, acct, charge = entry
        if used is not None:
            u = self.used.setdefault(used[0], [0, 0.0, 0.0])    # [jobs, G, E]
            u[0] += sign
            u[1] += sign * used[1]
            u[2] += sign * used[2]
            if not u[0]:
                del self.used[used[0]]
        c = self.charged.setdefault(acct, [0, 0.0])             # [jobs, charge]
        c[0] += sign
        c[1] += sign * charge
        if not c[0]:
            del self.charged[acct]

    def add_to(self, fs: FairShare, t_now: float) -> FairShare:
        """Their usage so far and the GPUs they hold from now on, into `fs`."""
        h = self.half_life
        decay = 2.0 ** (-(t_now - self.t0) / h)
        for acct, (_, g, e) in self.used.items():
            fs.usage[acct] = fs.usage.get(acct, 0.0) + max(0.0, h / math.log(2) * (g - decay * e))
        for acct, (_, charge) in self.charged.items():
            fs.running[acct] = fs.running.get(acct, 0) + charge
        return fs
