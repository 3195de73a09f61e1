"""The unit of work every domain module shares: the settings, the database engine and its
sessions (`sessions` for transactions that write, `reads` for reads), the cluster, the
plugins, the wake event and the caches passes keep; plus the few reads and writes each
resource needs (a job by id, its owner's check, the policy in force, an event, a release).

Every change is one transaction; the committed store is the only truth: the leader's
state in memory follows it (warm.py) and a restart loses nothing."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from pydantic import ValidationError
from sqlalchemy import select

from ..engine.cluster import Cluster
from ..engine.state import ClusterState
from ..errors import describe_validation_error
from ..plugins import Registry, default_registry
from ..policy.config import PolicyConfig, TeamPolicy
from ..store.db import make_engine, sessions, snapshot, upgrade
from ..store.models import JobRow, TeamRow
from . import notify, rights
from .changes import Changes, Wake
from .common import Principal, event, release
from .errors import NotFound


@dataclass
class Settings:
    db_url: str
    cluster: Cluster
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    lease_ttl: float = 60.0          # seconds an admitted/running job lives without heartbeat
    pass_interval: float = 2.0       # seconds between scheduling passes
    host_timeout: float = 60.0       # seconds a host's node agent may be silent (unreachable)
    deployment: str | None = None    # names the leader lock (default: the database schema)
    # PostgreSQL connections pooled per process (default: $AIRFLOW_GPU_DB_POOL_SIZE, else
    # the API's threads and the loop's, store.db.POOL_SIZE); see "Connection budget"
    db_pool_size: int | None = None


class Store:
    def __init__(self, settings: Settings, reg: Registry | None = None):
        self.settings = settings
        self.cluster = settings.cluster
        self.reg = reg or default_registry()
        self.engine = make_engine(settings.db_url, pool_size=settings.db_pool_size)
        upgrade(self.engine)
        self.sessions = sessions(self.engine)          # transactions that write
        self.notified = threading.Event()    # notifications committed (webhooks.py)
        notify.watch(self.sessions, self.notified)     # job events' outbox rows
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.read_engine = (make_engine(settings.db_url, writes=False)
                            if self.engine.dialect.name == "sqlite" else self.engine)
        self.reads = (sessions(self.read_engine)
                      if self.engine.dialect.name == "sqlite" else self.sessions)
        self._policy_cache: tuple[float, PolicyConfig] | None = None
        self.warm = None                     # the leader's state between passes (warm.py)
        self.state_lock = threading.Lock()   # held while a pass changes it (storepass.py)
        self.scheduling = False              # a loop runs passes (loop.py)
        self.rebuilt: list[str] = []         # why the last pass read its state anew
        self.pass_phases = None              # the last pass's parts (storepass.Phases)
        self._empty = ClusterState(self.cluster)
        self._never: dict[tuple, str | None] = {}   # job shape -> why it never fits
        self.changes = Changes()             # tells waiting requests (changes.py)
        self.wake = Wake(self.changes)       # set when a pass is worth running now
        # hosts registered by node agents join the file's (agents.py)
        self._models: dict = {}
        self._cluster_sig: tuple | None = ()
        self._cluster_checked = 0.0
        self._cluster_lock = threading.Lock()
        self._silent: set[str] = set()       # hosts the last pass found unreachable
        self.policy_errors: dict[str, str] = {}   # team -> why its stored setting is refused
        self.pass_errors: list[str] = []     # kinds of errors the last pass got past
        self.preemptions: list[str] = []     # the last pass's preemptions, by reason
        self.told: dict[tuple[str, str], str] = {}   # ("team"|"job", name) -> error told
        self.dep_reasons: dict[str, str] = {}   # waiting job or array -> reason written
        from .slowdown import LearnedSlowdown
        from .usage import EndedUsage

        self.ended_usage = EndedUsage()             # fair share's usage of ended jobs
        self.slowdown = LearnedSlowdown(self.reg)   # the locality slowdown passes plan with

    _event = staticmethod(event)
    _release = staticmethod(release)

    def get(self, job_id: str) -> JobRow:
        with self.reads() as s:
            row = s.get(JobRow, job_id)
        if row is None:
            raise NotFound(f"job {job_id!r} does not exist")
        return row

    def _owned(self, job_id: str, who: Principal) -> JobRow:
        """The job, if `who` may change it (rights.py: an admin, its team's token, or its
        user's token); Forbidden (403) otherwise. Every write to one job goes through it."""
        row = self.get(job_id)
        rights.check(who, row)
        return row

    def snapshot(self):
        """A read-only transaction whose reads all see one committed state (store.db)."""
        return snapshot(self.read_engine)

    def _policy(self) -> PolicyConfig:
        """The policy file with the admins' team shares and quotas; read at most once a
        second (a quota change takes effect within a second)."""
        now = time.monotonic()
        if self._policy_cache and now - self._policy_cache[0] < 1.0:
            return self._policy_cache[1]
        with self.reads() as s:
            teams = list(s.scalars(select(TeamRow)))
        policy = self._merge_teams(teams)
        self._policy_cache = (now, policy)
        return policy

    def _merge_teams(self, teams: list[TeamRow]) -> PolicyConfig:
        self.policy_errors = {}
        if not teams:
            return self.settings.policy
        merged = dict(self.settings.policy.teams)
        errors = {}
        for t in teams:
            base = merged.get(t.name, TeamPolicy())
            try:
                merged[t.name] = TeamPolicy.model_validate({
                    **base.model_dump(exclude_unset=True),
                    "share": t.share if t.share is not None else base.share,
                    "quota_gpus": t.quota_gpus,
                    "borrow_gpus": t.borrow_gpus if t.borrow_gpus is not None
                    else base.borrow_gpus})
            except ValidationError as exc:   # a row from before the bounds, say: not fatal
                file = self.settings.policy
                quota = file.quota(t.name)
                errors[t.name] = (f"team {t.name}: its stored setting is refused "
                                  f"({describe_validation_error(exc, TeamPolicy)}); the "
                                  f"policy file's share {file.share(t.name):g} and quota "
                                  f"{'none' if quota is None else quota} "
                                  "apply until an admin sets it again (airflow-gpu team-set "
                                  f"{t.name} --share 1)")
        self.policy_errors = errors
        return self.settings.policy.model_copy(update={"teams": merged})

    def refresh_cluster(self, force: bool = False) -> None:
        """Take in hosts node agents registered (here or on another replica)."""
        from .agents import refresh

        refresh(self, force)
