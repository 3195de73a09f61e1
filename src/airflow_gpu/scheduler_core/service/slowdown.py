"""The locality slowdown and the teams' estimate factors the service plans with, learned
from the jobs that succeeded.

The service knows each job's placement (its allocation rows) and its actual runtime
(admitted to finished). Every pass reads the jobs that succeeded since the last one (a
batch at most) and feeds them to the engine's `LocalityModel`, which the pass's
scheduler plans with. A new process reads the whole history this way once; a changed
policy (factors, learning, default runtime) starts the model anew. Requeued jobs are
left out: their last admission's hosts are not told apart from the earlier ones'.
"""

from __future__ import annotations

import threading
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from ..engine.cluster import TIERS, Cluster, tier_of_hosts
from ..errors import InputError
from ..jobclasses import resolve
from ..jobspec import JobSpec
from ..plugins import Registry
from ..policy.config import PolicyConfig
from ..policy.correction import source
from ..policy.scheduler import planned_runtime
from ..policy.timemodel import LocalityModel
from ..store.models import AllocationRow, JobRow
from .common import _ts

BATCH = 5000     # jobs read per pass: a long history is learned over a few passes


class LearnedSlowdown:
    def __init__(self, reg: Registry):
        self.reg = reg
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self.model = LocalityModel(PolicyConfig().locality_slowdown)
        self._mark: tuple[datetime, str] | None = None     # (finished_at, id) read up to

    def update(self, s: Session, policy: PolicyConfig, cluster: Cluster) -> LocalityModel:
        """A copy of the model with every job that succeeded since the last call."""
        with self._lock:
            key = (policy.locality_slowdown, policy.learn_slowdown, policy.default_runtime,
                   policy.correct_estimates, policy.estimate_quantile)
            if key != self._key:
                self._key, self._mark = key, None
                self.model = LocalityModel.for_policy(policy)
            if not policy.learn_slowdown and policy.correct_estimates == "off":
                return self.model.copy()
            q = (select(JobRow.id, JobRow.spec, JobRow.admitted_at, JobRow.finished_at)
                 .where(JobRow.state == "succeeded", JobRow.attempt <= 1,
                        JobRow.admitted_at.is_not(None), JobRow.finished_at.is_not(None))
                 .order_by(JobRow.finished_at, JobRow.id).limit(BATCH))
            if self._mark is not None:
                at, job_id = self._mark
                q = q.where(or_(JobRow.finished_at > at,
                                and_(JobRow.finished_at == at, JobRow.id > job_id)))
            rows = s.execute(q).all()
            if not rows:
                return self.model.copy()
            hosts: dict[str, set[str]] = {}
            for job_id, host in s.execute(select(AllocationRow.job_id, AllocationRow.host)
                                          .where(AllocationRow.job_id.in_([r[0] for r in rows]))):
                hosts.setdefault(job_id, set()).add(host)
            for job_id, spec, admitted, finished in rows:
                self._observe(policy, cluster, job_id, spec, hosts.get(job_id, set()),
                              _ts(finished) - _ts(admitted))
            self._mark = (rows[-1][3], rows[-1][0])
            return self.model.copy()

    def _observe(self, policy: PolicyConfig, cluster: Cluster, job_id: str, spec: dict,
                 hosts: set[str], actual: float) -> None:
        if any(h not in cluster.by_name for h in hosts):
            return                       # its host left the cluster: its tier is unknown
        try:
            resolved = resolve(JobSpec.model_validate({**spec, "name": job_id}),
                               self.reg.job_classes)
        except (InputError, ValidationError):   # its class or spec format is gone
            return
        tier = tier_of_hosts(cluster.by_name[h] for h in hosts)
        self.model.observe_run(resolved.job_class, resolved.team,
                               source(resolved.expected_runtime, resolved.time_limit), tier,
                               planned_runtime(resolved, policy), actual)

    def report(self) -> dict:
        """What the passes plan with: the policy's factors and, per job class, the learned."""
        with self._lock:
            m = self.model
            return {"tiers": list(TIERS), "default": list(m.defaults), "learn": m.learn,
                    "classes": m.report(), "correct_estimates": m.estimates.mode,
                    "estimate_quantile": m.estimates.quantile,
                    "estimates": m.estimates.report()}
