"""The service over the store: submit, cancel, heartbeat, finish, hosts, leases, and the
scheduling pass. Every change is one transaction; the committed store is the only truth,
so the pass rebuilds the engine's state from it each time and a restart loses nothing.

State changes are guarded updates (`... WHERE state IN (...)`), so a cancel racing the
pass can never be overwritten by an admission, and the hold tables' keys make the
database refuse a GPU or core granted twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import ValidationError
from sqlalchemy import delete, func, insert, inspect, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..engine.cluster import Cluster
from ..engine.mig import gpu_share
from ..engine.nvlink_groups import nvlink_groups
from ..engine.placement import compile_needs, never_fits
from ..engine.state import ClusterState
from ..errors import InputError, describe_validation_error
from ..jobclasses import resolve
from ..jobspec import JobSpec
from ..plugins import Registry, default_registry
from ..policy.config import PolicyConfig, TeamPolicy
from ..policy.jobqueue import job_shape
from ..policy.quota import lending, over_quota, plain, spec_need
from ..policy.scheduler import Rejected
from ..store.db import make_engine, sessions, upgrade
from ..store.models import (
    AllocationRow,
    CpuHoldRow,
    EventRow,
    GpuHoldRow,
    GpuRow,
    HostRow,
    JobRow,
    MigHoldRow,
    TeamRow,
)

log = logging.getLogger(__name__)

PENDING = "pending"
UTILIZATION = ("utilization_gpu", "utilization_memory", "memory_used_bytes", "power_watts",
               "temperature_c", "uuid", "energy_joules", "sm_active", "thermal_throttle")
# live: holding resources; `preempting`: being stopped for another job (it keeps them
# until its launcher says it has stopped, or its preempt deadline passes)
LIVE = ("admitted", "running", "preempting")
ENDED = ("succeeded", "failed", "cancelled", "lost", "timeout")


class NotFound(LookupError):
    pass


class Forbidden(PermissionError):
    pass


class Conflict(RuntimeError):
    pass


@dataclass(frozen=True)
class Principal:
    team: str
    admin: bool = False

    def may_act_for(self, team: str) -> bool:
        return self.admin or self.team == team


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


def utcnow() -> datetime:
    return datetime.now(UTC)


def _ts(dt: datetime) -> float:
    if dt.tzinfo is None:          # SQLite gives naive datetimes back: they were UTC
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _update(table):
    """An UPDATE that does not walk the session's objects (a pass holds thousands)."""
    return update(table).execution_options(synchronize_session=False)


def eta_seconds(row: JobRow, now: float | None = None) -> int | None:
    """Whole seconds until the planned start (kept as a time, so it needs no rewrites)."""
    if row.eta_at is None:
        return None
    return max(0, round(row.eta_at - (time.time() if now is None else now)))


def _columns(row) -> dict:
    return {c.key: getattr(row, c.key) for c in inspect(type(row)).column_attrs}


def _same_attempt(attempt: int | None) -> tuple:
    return () if attempt is None else (JobRow.attempt == attempt,)


def _stale(row: JobRow, attempt: int | None, rule: str) -> str:
    if attempt is not None and row.state in LIVE and row.attempt != attempt:
        return (f"job {row.id} was requeued and admitted again (admission {row.attempt}); "
                f"this launcher started admission {attempt}: stop it and launch the new "
                "placement")
    return f"job {row.id} is {row.state}; {rule}"


def requeued(reason: str, **more) -> dict:
    """The columns of a job sent back to the queue under the same id."""
    return dict(state=PENDING, admitted_at=None, started_at=None, lease_expires_at=None,
                reason_code=None, reason=None, details={}, eta_at=None, promised_at=None,
                deadline_at=None, limit_cut_by=None, preempt_deadline_at=None,
                borrowed=False, requeue_reason=reason, idle_since=None, idle_flagged_at=None,
                **more)


def spec_gpus(spec: dict) -> float:
    """GPUs a stored spec is charged (whole GPUs plus MIG shares, quota.charged_gpus); 0
    for one it cannot read (an ended job's bad spec must not stop every pass while its
    usage counts in fair share)."""
    try:
        total = 0.0
        for r in spec.get("roles", []):
            mig = (r.get("gpu") or {}).get("mig")
            if isinstance(mig, str):
                mig = {"profile": mig}
            share = float(gpu_share(mig["profile"]) * mig.get("count", 1)) if mig else 0.0
            total += (int(r.get("gpus", 0)) + share) * r.get("replicas", 1)
        return total
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def spec_digest(spec: JobSpec) -> str:
    """SHA-256 of a spec with every default filled in: specs meaning the same job (a field
    left out or given its default, keys in another order) have the same digest."""
    normal = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(normal.encode()).hexdigest()


def _stored_digest(row: JobRow) -> str | None:
    """The digest of a job's spec as submitted; for a job stored before 0009, of its spec
    now (None if it no longer validates)."""
    if row.spec_digest:
        return row.spec_digest
    try:
        return spec_digest(JobSpec.model_validate(row.spec))
    except (ValidationError, TypeError, ValueError):
        return None


def same_job(found: JobRow, row: JobRow) -> None:
    """`row` reuses the idempotency key of `found`, which the store holds: fine for the
    same spec (a retry), a Conflict for another one."""
    if _stored_digest(found) != row.spec_digest:
        raise Conflict(f"idempotency_key {row.idempotency_key!r} was used for job "
                       f"{found.id} with another spec; use a new key")


class Service:
    def __init__(self, settings: Settings, reg: Registry | None = None):
        self.settings = settings
        self.cluster = settings.cluster
        self.reg = reg or default_registry()
        self.engine = make_engine(settings.db_url, pool_size=settings.db_pool_size)
        upgrade(self.engine)
        self.sessions = sessions(self.engine)          # transactions that write
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.reads = (sessions(make_engine(settings.db_url, writes=False))
                      if self.engine.dialect.name == "sqlite" else self.sessions)
        self._policy_cache: tuple[float, PolicyConfig] | None = None
        self._specs: dict[str, tuple] = {}   # job id -> (its key, parsed spec), for passes
        self._empty = ClusterState(self.cluster)
        self._never: dict[tuple, str | None] = {}   # job shape -> why it never fits
        self.wake = threading.Event()        # set when a pass is worth running now
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
        from .slowdown import LearnedSlowdown

        self.slowdown = LearnedSlowdown(self.reg)   # the locality slowdown passes plan with
        self.refresh_cluster(force=True)
        try:
            self.sync_hosts()
        except IntegrityError:   # a replica starting beside this one added them first
            self.sync_hosts()

    # -- hosts ----------------------------------------------------------------------------
    def sync_hosts(self) -> None:
        """Hosts of the cluster file into the store; drain and health are kept."""
        with self.sessions.begin() as s:
            known = {h.name: h for h in s.scalars(select(HostRow))}
            for h in self.cluster.hosts:
                row = known.get(h.name)
                if row is None:
                    s.add(HostRow(name=h.name, model=h.type.model, rack=h.rack,
                                  switch=h.switch, docker_url=h.docker_url,
                                  labels=dict(h.labels), drained=False))
                else:
                    row.model, row.rack, row.switch = h.type.model, h.rack, h.switch
                    row.docker_url, row.labels = h.docker_url, dict(h.labels)
            s.flush()
            gpus = {(g.host, g.index) for g in s.scalars(select(GpuRow))}
            for h in self.cluster.hosts:
                t = h.type
                s.add_all(GpuRow(host=h.name, index=i, name=t.gpu_name[i],
                                 memory_bytes=t.gpu_mem[i], numa_node=t.numa_ids[t.gpu_numa[i]],
                                 healthy=True) for i in range(t.n_gpus)
                          if (h.name, i) not in gpus)

    def refresh_cluster(self, force: bool = False) -> None:
        """Take in hosts node agents registered (here or on another replica)."""
        from .agents import refresh

        refresh(self, force)

    def register_host(self, name: str, who: Principal, topology, reg: dict) -> dict:
        """A node agent registers its host's model; the host joins the cluster (or its
        declared model is replaced) and counts as reporting. Returns its cluster view."""
        from .agents import register

        if not who.admin:
            raise Forbidden("only a node agent's token (airflow-gpu token create --agent --host "
                            f"{name}) or an admin token registers hosts")
        register(self, name, topology, reg, utcnow(), who)
        self.refresh_cluster(force=True)
        self.wake.set()
        return self.host_view(name)

    def forget_host(self, name: str, who: Principal) -> None:
        from .agents import forget

        if not who.admin:
            raise Forbidden("only admins remove a host's node agent registration")
        forget(self, name)
        self.refresh_cluster(force=True)
        self.wake.set()

    def report_gpus(self, name: str, who: Principal, gpus: list[dict]) -> list[GpuRow]:
        """Health and utilization of a host's GPUs, as its node agent (or an admin) reports
        it (a heartbeat of the host). An unhealthy GPU gets no new work; jobs on it are
        handled by their class's on_gpu_failure policy (faults.py)."""
        from .accounting import record
        from .agents import reachable
        from .faults import handle_gpu_faults
        from .idle import evaluate
        from .wear import wear

        if not who.admin:
            raise Forbidden("only a node agent's token (airflow-gpu token create --agent --host "
                            f"{name}) or an admin token reports host health")
        host = self.cluster.by_name.get(name)
        if host is None:
            self.refresh_cluster(force=True)
            host = self.cluster.by_name.get(name)
        if host is None:
            raise NotFound(f"host {name!r} is not in the cluster; its node agent registers "
                           "it (PUT /api/v1/hosts/{name})")
        now = utcnow()
        with self.sessions.begin() as s:
            hrow = s.get(HostRow, name)
            if not reachable(hrow, self.settings.host_timeout, _ts(now)):
                self._event(s, "host", f"host {name} is reachable again: its node agent "
                            "reported", host=name)
            for g in gpus:
                if not 0 <= g["index"] < host.type.n_gpus:
                    raise InputError(f"gpus[].index: {g['index']} is not a GPU of {name} "
                                     f"(it has GPUs 0-{host.type.n_gpus - 1})")
                row = s.get(GpuRow, (name, g["index"]))
                if row.healthy != g["healthy"]:
                    self._event(s, "health", f"GPU {name}:{g['index']} "
                                f"{'healthy' if g['healthy'] else 'unhealthy'}"
                                + (f" ({g.get('reason')})" if g.get("reason") else ""),
                                host=name)
                row.healthy, row.health_reason, row.reported_at = (
                    g["healthy"], g.get("reason"), now)
                for key in UTILIZATION:
                    if key in g:
                        setattr(row, key, g[key])
                wear(row, g, now)
            hrow.reported_at = now
            s.flush()
            handle_gpu_faults(self, s, now, host=name)
            evaluate(self, s, record(self, s, name, gpus, now), now)
        self.wake.set()
        with self.reads() as s:
            return list(s.scalars(select(GpuRow).where(GpuRow.host == name)
                                  .order_by(GpuRow.index)))

    def set_drained(self, name: str, drained: bool, who: Principal,
                    reason: str | None = None) -> HostRow:
        """Drain (with why: shown in the cluster view and in pending reasons that name
        the host) or resume a host; resuming clears the reason."""
        if not who.admin:
            raise Forbidden("only admins drain or resume hosts")
        with self.sessions.begin() as s:
            row = s.get(HostRow, name)
            if row is None:
                raise NotFound(f"host {name!r} is not in the cluster")
            if drained and (not row.drained or reason):
                row.drained_at = utcnow() if not row.drained else row.drained_at
                row.drain_reason = reason or (row.drain_reason if row.drained else None)
                row.drained_by = who.team
            elif not drained:
                row.drain_reason = row.drained_at = row.drained_by = None
            row.drained = drained
            self._event(s, "host", f"host {name} {'drained' if drained else 'resumed'}"
                        + (f" (reason: {reason})" if drained and reason else ""), host=name)
        self.wake.set()
        return row

    def host_view(self, name: str) -> dict:
        found = self.cluster_view(only=name)["hosts"]
        if not found:
            raise NotFound(f"host {name!r} is not in the cluster")
        return found[0]

    # -- teams ------------------------------------------------------------------------------
    def set_team(self, name: str, who: Principal, share: float | None,
                 quota_gpus: int | None, borrow_gpus: int | None = None) -> dict:
        """Admins set a team's fair-share weight, GPU quota (None: no quota) and how many
        GPUs beyond it the team may borrow (None: the policy file's)."""
        if not who.admin:
            raise Forbidden("only admins change team shares and quotas")
        try:     # the API checks too; this guards every other caller
            TeamPolicy(share=1.0 if share is None else share, quota_gpus=quota_gpus,
                       borrow_gpus=borrow_gpus or 0)
        except ValidationError as exc:
            raise InputError(describe_validation_error(exc, TeamPolicy)) from None
        with self.sessions.begin() as s:
            row = s.get(TeamRow, name) or TeamRow(name=name)
            row.share, row.quota_gpus, row.borrow_gpus = share, quota_gpus, borrow_gpus
            s.add(row)
            self._event(s, "team", f"team {name}: share {share}, quota_gpus {quota_gpus}"
                        + ("" if borrow_gpus is None else f", borrow_gpus {borrow_gpus}"))
        self._policy_cache = None
        self.wake.set()
        return self.teams()[name]

    def teams(self) -> dict[str, dict]:
        """Every team with a policy, a job or a quota: share, quota and GPUs held now."""
        policy = self._policy()
        with self.reads() as s:
            held = dict(s.execute(select(JobRow.team, func.count(GpuHoldRow.gpu))
                                  .join(GpuHoldRow, GpuHoldRow.job_id == JobRow.id)
                                  .group_by(JobRow.team)).all())
            names = set(s.scalars(select(JobRow.team).distinct()))
            from .clusterview import mig_shares

            for team, share in mig_shares(self.cluster, s).items():   # MIG: by share
                held[team] = held.get(team, 0) + share
        names |= set(policy.teams)
        lent = lending(policy, held, self.cluster.total_gpus)
        return {t: {"name": t, "share": policy.share(t), "quota_gpus": policy.quota(t),
                    "borrow_gpus": policy.teams[t].borrow_gpus if t in policy.teams else None,
                    "held_gpus": plain(held.get(t, 0)),
                    "borrowed_gpus": lent.get(t, (0, 0))[0],
                    "lent_gpus": lent.get(t, (0, 0))[1], "error": self.policy_errors.get(t)}
                for t in sorted(names)}

    # -- jobs -----------------------------------------------------------------------------
    def submit(self, spec: JobSpec, who: Principal,
               key: str | None = None) -> tuple[JobRow, bool]:
        """Queue a job; (row, created). The same idempotency key (per team) returns the
        job it created first; with another spec it is a Conflict. Raises Rejected (can
        never run) or InputError (bad class)."""
        row = self.job_row(spec, who, key)
        try:   # the unique (team, key) index answers "seen before?" without a lookup
            # The hot path of the API: one INSERT that commits itself (one round trip);
            # the job's "submitted" event is its submitted_at.
            with self._autocommit.connect() as conn:
                conn.execute(insert(JobRow), [_columns(row)])
        except IntegrityError:
            found = self._by_key(row.team, row.idempotency_key) if row.idempotency_key \
                else None
            if found is None:
                raise
            same_job(found, row)
            return found, False
        self.wake.set()
        return row, True

    def job_row(self, spec: JobSpec, who: Principal, key: str | None = None) -> JobRow:
        """The row a submit inserts, once `who` may submit `spec` and it can run: raises
        Forbidden (another team's), Rejected (can never run) or InputError (bad class).
        Shared by the single and the batch submit (batch.py)."""
        key = key or None                 # an empty key is no key
        if "team" not in spec.model_fields_set:
            spec = spec.model_copy(update={"team": who.team})
        if not who.may_act_for(spec.team):
            raise Forbidden(f"team: your token is for team {who.team!r}, not {spec.team!r}")
        resolved = resolve(spec, self.reg.job_classes, defaults=self._policy().defaults)
        why = self._rejection(resolved)
        if why:
            raise Rejected(spec.name, why)
        return JobRow(id=str(uuid.uuid4()), name=spec.name, team=spec.team,
                      idempotency_key=key,
                      spec={**spec.model_dump(mode="json", exclude_unset=True),
                            "team": spec.team},
                      state=PENDING, priority=spec.priority, details={}, attempt=0,
                      borrowed=False, preemptions=0, idle_requeues=0,
                      # what a retry with the same key must match (none without a key)
                      spec_digest=spec_digest(spec) if key else None,
                      submitted_at=utcnow())

    def _by_key(self, team: str, key: str) -> JobRow | None:
        with self.reads() as s:
            return s.scalars(select(JobRow).where(
                JobRow.team == team, JobRow.idempotency_key == key)).first()

    def _rejection(self, spec: JobSpec) -> str | None:
        jc = self.reg.job_classes.get(spec.job_class or "")
        why = over_quota(self._policy(), spec.team, spec_need(spec),
                         jc is None or jc.preemptible)
        if why:
            return why
        self.refresh_cluster()
        key, never, empty = job_shape(spec), self._never, self._empty
        if key not in never:
            never[key] = never_fits(spec, empty, self.reg, compile_needs(spec))
        return never[key]

    def get(self, job_id: str) -> JobRow:
        with self.reads() as s:
            row = s.get(JobRow, job_id)
        if row is None:
            raise NotFound(f"job {job_id!r} does not exist")
        return row

    def list_jobs(self, state: str | None = None, team: str | None = None,
                  limit: int = 1000, name: str | None = None,
                  newest_first: bool = False) -> list[JobRow]:
        order = (JobRow.submitted_at.desc(), JobRow.id.desc()) if newest_first else (
            JobRow.submitted_at, JobRow.id)
        q = select(JobRow).order_by(*order).limit(limit)
        if state:
            q = q.where(JobRow.state == state)
        if team:
            q = q.where(JobRow.team == team)
        if name:
            q = q.where(JobRow.name == name)
        with self.reads() as s:
            return list(s.scalars(q))

    def allocations(self, job_id: str) -> list[AllocationRow]:
        with self.reads() as s:
            return list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)
                                  .order_by(AllocationRow.id)))

    def live_allocations(self, job_ids: list[str]) -> dict[str, list[AllocationRow]]:
        """Live allocations of these jobs, in one query."""
        out: dict[str, list[AllocationRow]] = {}
        with self.reads() as s:
            for a in s.scalars(select(AllocationRow).where(
                    AllocationRow.live.is_(True), AllocationRow.job_id.in_(job_ids))
                    .order_by(AllocationRow.id)):
                out.setdefault(a.job_id, []).append(a)
        return out

    def events(self, job_id: str) -> list[EventRow]:
        job = self.get(job_id)
        with self.reads() as s:
            stored = list(s.scalars(select(EventRow).where(EventRow.job_id == job_id)
                                    .order_by(EventRow.id)))
        return [EventRow(at=job.submitted_at, job_id=job_id, kind="submitted",
                         message=f"submitted by team {job.team}"), *stored]

    def cancel(self, job_id: str, who: Principal) -> JobRow:
        return self._end(job_id, who, "cancelled", None, from_states=(PENDING, *LIVE))

    def finish(self, job_id: str, who: Principal, outcome: str,
               exit_code: int | None, attempt: int | None = None) -> JobRow:
        if outcome == "preempted":
            from .preemption import stopped

            self._owned(job_id, who)
            return stopped(self, job_id, attempt)
        return self._end(job_id, who, outcome, exit_code, from_states=LIVE, attempt=attempt)

    def _owned(self, job_id: str, who: Principal) -> JobRow:
        """The job, if `who` may act on it (its team, or an admin)."""
        row = self.get(job_id)
        if not who.may_act_for(row.team):
            raise Forbidden(f"job {job_id} belongs to team {row.team!r}; your token is for "
                            f"team {who.team!r}")
        return row

    def _end(self, job_id: str, who: Principal, state: str, exit_code: int | None,
             from_states: tuple[str, ...], attempt: int | None = None) -> JobRow:
        self._owned(job_id, who)
        with self.sessions.begin() as s:
            done = s.execute(_update(JobRow).where(
                JobRow.id == job_id, JobRow.state.in_(from_states),
                *_same_attempt(attempt)).values(
                state=state, finished_at=utcnow(), exit_code=exit_code,
                outcome=state, lease_expires_at=None))
            if done.rowcount != 1:
                current = s.get(JobRow, job_id)
                if current.state == state:
                    return current            # repeating a cancel or finish is harmless
                raise Conflict(_stale(current, attempt, f"only a job that is "
                                      f"{' or '.join(from_states)} can become {state}"))
            self._release(s, job_id)
            self._event(s, state, f"{state}" + (f" (exit code {exit_code})"
                                                if exit_code is not None else ""), job=job_id)
        self.wake.set()
        return self.get(job_id)

    def heartbeat(self, job_id: str, who: Principal, attempt: int | None = None) -> JobRow:
        """The launcher is alive: extend the lease; the first heartbeat marks it running.
        With `attempt`, only that admission counts: a launcher that missed a requeue and
        re-admission hears 409 instead of confirming placements it never started."""
        self._owned(job_id, who)
        now = utcnow()
        lease = now + timedelta(seconds=self.settings.lease_ttl)
        same = _same_attempt(attempt)
        with self.sessions.begin() as s:
            started = s.execute(_update(JobRow).where(
                JobRow.id == job_id, JobRow.state == "admitted", *same).values(
                state="running", started_at=now, lease_expires_at=lease))
            if started.rowcount == 1:
                self._event(s, "running", "the launcher confirmed the start", job=job_id)
            else:
                kept = s.execute(_update(JobRow).where(
                    JobRow.id == job_id, JobRow.state.in_(("running", "preempting")),
                    *same).values(lease_expires_at=lease))
                if kept.rowcount != 1:
                    raise Conflict(_stale(s.get(JobRow, job_id), attempt,
                                          "admitted or running jobs take heartbeats"))
        return self.get(job_id)

    @staticmethod
    def _release(s: Session, job_id: str) -> None:
        s.execute(delete(GpuHoldRow).where(GpuHoldRow.job_id == job_id))
        s.execute(delete(MigHoldRow).where(MigHoldRow.job_id == job_id))
        s.execute(delete(CpuHoldRow).where(CpuHoldRow.job_id == job_id))
        s.execute(_update(AllocationRow).where(AllocationRow.job_id == job_id,
                                               AllocationRow.live.is_(True))
                  .values(live=False, released_at=utcnow()))

    @staticmethod
    def _event(s: Session, kind: str, message: str, job: str | None = None,
               host: str | None = None) -> None:
        s.add(EventRow(at=utcnow(), job_id=job, host=host, kind=kind, message=message))

    # -- the scheduling pass --------------------------------------------------------------
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

    def slowdown_view(self) -> dict:
        """The locality slowdown the passes plan with, as learned so far."""
        with self.reads() as s:
            self.slowdown.update(s, self._policy(), self.cluster)
        return self.slowdown.report()

    def schedule_pass(self) -> list[str]:
        """One pass of the engine on the committed state (see storepass.py); returns the
        admitted job ids."""
        from .storepass import run_pass

        return run_pass(self)

    # -- the cluster view ---------------------------------------------------------------------
    def cluster_view(self, only: str | None = None) -> dict:
        """Hosts (all, or the one named `only`), their GPUs' health, utilization and
        holders, and whether each host's node agent is reporting."""
        from .agents import reachable
        from .wear import reasons as wear_reasons

        self.refresh_cluster()
        cluster, now = self.cluster, time.time()
        at = datetime.fromtimestamp(now, UTC)     # the same instant, for wear's window
        with self.reads() as s:
            hosts = {h.name: h for h in s.scalars(select(HostRow).where(
                *([HostRow.name == only] if only else [])))}
            health = {(g.host, g.index): g for g in s.scalars(select(GpuRow))}
            holds = {(g.host, g.gpu): g.job_id for g in s.scalars(select(GpuHoldRow))}
            mig_holds = {(m.host, m.gpu, m.device): m.job_id
                         for m in s.scalars(select(MigHoldRow))}
            jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.state.in_(LIVE)))}
        from .clusterview import mig_view

        out = []
        for h in cluster.hosts:
            if only and h.name != only:
                continue
            row = hosts.get(h.name)
            gpus = []
            for g in range(h.type.n_gpus):
                job = holds.get((h.name, g))
                rec = health.get((h.name, g))
                gpus.append({"index": g, "name": h.type.gpu_name[g],
                             "numa_node": h.type.numa_ids[h.type.gpu_numa[g]],
                             "healthy": rec.healthy if rec else True,
                             "health_reason": rec.health_reason if rec else None,
                             # scored down for long jobs (wear.py), never excluded
                             "worn": "; ".join(wear_reasons(rec, at)) or None
                             if rec and rec.healthy else None, "job": job,
                             "team": jobs[job].team if job in jobs else None,
                             **{k: getattr(rec, k) if rec else None for k in UTILIZATION},
                             **mig_view(h.type, g, h.name, mig_holds, jobs)})
            up = not (row and row.drained) and reachable(row, self.settings.host_timeout, now)
            out.append({"name": h.name, "model": h.type.model, "rack": h.rack,
                        "switch": h.switch, "nvlink_domain": h.nvlink_domain,
                        "docker_url": h.docker_url,
                        "address": h.address or h.name, "drained": bool(row and row.drained),
                        "drain_reason": row.drain_reason if row and row.drained else None,
                        "drained_at": row.drained_at if row and row.drained else None,
                        "drained_by": row.drained_by if row and row.drained else None,
                        "reachable": reachable(row, self.settings.host_timeout, now),
                        "last_report_at": row.reported_at if row else None,
                        "agent": bool(row and row.registered_at),
                        "nvlink": {"fabric": h.type.fabric,
                                   "groups": nvlink_groups(h.type.links)},
                        "gpus": gpus,
                        # drained and unreachable hosts' GPUs are never free
                        "free_gpus": sum(1 for x in gpus if x["job"] is None and x["healthy"]
                                         and not x.get("mig_mode")) if up else 0})
        from .clusterview import add_allocation

        return add_allocation(self, {"cluster": cluster.name, "hosts": out,
                                     "gpus_total": sum(len(h["gpus"]) for h in out),
                                     "gpus_allocated": len(holds)})
