"""Prometheus metrics. Gauges are read from the store at scrape time (any replica answers
the same); counters and the pass-duration histogram count what this process did."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from ..store.models import GpuHoldRow, GpuRow, HostRow, JobRow, MigHoldRow
from .core import LIVE

# per-GPU gauges from the node agents' latest samples: (column, metric, help)
_GPU_GAUGES = (
    ("utilization_gpu", "airflow_gpu_gpu_utilization_percent", "GPU utilization"),
    ("utilization_memory", "airflow_gpu_gpu_memory_utilization_percent",
     "GPU memory bandwidth utilization"),
    ("memory_used_bytes", "airflow_gpu_gpu_memory_used_bytes", "GPU memory in use"),
    ("power_watts", "airflow_gpu_gpu_power_watts", "GPU power draw"),
    ("temperature_c", "airflow_gpu_gpu_temperature_celsius", "GPU temperature"),
)


class Metrics:
    def __init__(self, service):
        self.registry = CollectorRegistry()
        self.admissions = Counter("airflow_gpu_admissions", "jobs admitted",
                                  registry=self.registry)
        self.lease_expiries = Counter("airflow_gpu_lease_expiries",
                                      "jobs lost because their lease expired",
                                      registry=self.registry)
        self.pass_seconds = Histogram("airflow_gpu_scheduling_pass_seconds",
                                      "duration of one scheduling pass",
                                      registry=self.registry,
                                      buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.pass_phase_seconds = Histogram(
            "airflow_gpu_scheduling_pass_phase_seconds", "duration of each part of a "
            "scheduling pass (before: faults, reservations, dependencies; read: what "
            "changed; update: the state in memory; decide: the engine and its reasons; "
            "write)", ["phase"], registry=self.registry,
            buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.pass_errors = Counter("airflow_gpu_pass_errors", "errors scheduling passes got "
                                   "past (job, team: one per job or team, in each pass that "
                                   "met it) or that stopped a pass (pass)", ["kind"],
                                   registry=self.registry)
        for kind in ("pass", "job", "team"):
            self.pass_errors.labels(kind)
        self.preemptions = Counter("airflow_gpu_preemptions", "jobs preempted, by reason "
                                   "(priority: a rule let a higher band stop it; reclaim: "
                                   "its team's borrowed quota was taken back)", ["reason"],
                                   registry=self.registry)
        for reason in ("priority", "reclaim"):
            self.preemptions.labels(reason)
        self.state_rebuilds = Counter(
            "airflow_gpu_state_rebuilds", "times the leader read its scheduling state anew "
            "from the store, by why (leader: it began to lead; cluster: hosts changed; "
            "divergence: the periodic check found the store differs; policy: rebuilt "
            "from memory)", ["reason"], registry=self.registry)
        for reason in ("leader", "cluster", "divergence", "policy"):
            self.state_rebuilds.labels(reason)
        self.queue_wait = Histogram("airflow_gpu_queue_wait_seconds", "time from submit "
                                    "to admission of the jobs this process admitted",
                                    registry=self.registry,
                                    buckets=(1, 10, 60, 300, 900, 1800, 3600, 4 * 3600,
                                             12 * 3600, 86400, 3 * 86400, 7 * 86400))
        self.webhook_deliveries = Counter(
            "airflow_gpu_webhook_deliveries", "webhook notification attempts this process "
            "made, by outcome (delivered; failed: retried later; given_up)", ["outcome"],
            registry=self.registry)
        for outcome in ("delivered", "failed", "given_up"):
            self.webhook_deliveries.labels(outcome)
        self.registry.register(_StoreCollector(service))


def queue_waits(svc, admitted: list[str]) -> list[float]:
    """Seconds from submit to admission of the jobs a pass just admitted (their last
    admission: a requeued job waits again from its submit)."""
    if not admitted:
        return []
    from .core import _ts

    with svc.reads() as s:
        return [max(0.0, _ts(a) - _ts(sub)) for sub, a in s.execute(
            select(JobRow.submitted_at, JobRow.admitted_at).where(
                JobRow.id.in_(admitted), JobRow.admitted_at.is_not(None)))]


class _StoreCollector:
    def __init__(self, service):
        self.service = service

    def collect(self):
        from .agents import reachable

        svc = self.service
        svc.refresh_cluster()
        reach = GaugeMetricFamily("airflow_gpu_host_reachable", "1 while the host's node "
                                  "agent reports (hosts without an agent: 1)", labels=["host"])
        per_gpu = [GaugeMetricFamily(name, text, labels=["host", "gpu"])
                   for _, name, text in _GPU_GAUGES]
        total = GaugeMetricFamily("airflow_gpu_gpus", "GPUs per host", labels=["host"])
        healthy = GaugeMetricFamily("airflow_gpu_gpus_healthy", "healthy GPUs per host",
                                    labels=["host"])
        allocated = GaugeMetricFamily("airflow_gpu_gpus_allocated", "GPUs held per host",
                                      labels=["host"])
        jobs = GaugeMetricFamily("airflow_gpu_jobs", "jobs per team and state",
                                 labels=["team", "state"])
        with svc.reads() as s:
            unhealthy = dict(s.execute(select(GpuRow.host, func.count()).where(
                GpuRow.healthy.is_(False)).group_by(GpuRow.host)).all())
            held = dict(s.execute(select(GpuHoldRow.host, func.count())
                                  .group_by(GpuHoldRow.host)).all())
            # a GPU in MIG mode with a device held counts as allocated (as in `cluster`)
            for host, _ in set(s.execute(select(MigHoldRow.host, MigHoldRow.gpu)).all()):
                held[host] = held.get(host, 0) + 1
            counts = s.execute(select(JobRow.team, JobRow.state, func.count()).where(
                JobRow.state.in_(("pending", "admitted", "running")))
                .group_by(JobRow.team, JobRow.state)).all()
            hosts = {h.name: h for h in s.scalars(select(HostRow))}
            samples = list(s.scalars(select(GpuRow).where(GpuRow.reported_at.is_not(None))))
        now = time.time()
        for h in svc.cluster.hosts:
            bad = unhealthy.get(h.name, 0)
            total.add_metric([h.name], h.type.n_gpus)
            healthy.add_metric([h.name], h.type.n_gpus - bad)
            allocated.add_metric([h.name], held.get(h.name, 0))
            reach.add_metric([h.name], float(reachable(hosts.get(h.name),
                                                       svc.settings.host_timeout, now)))
        for team, state, n in counts:
            jobs.add_metric([team, state], n)
        for g in samples:
            for family, (column, _, _) in zip(per_gpu, _GPU_GAUGES, strict=True):
                value = getattr(g, column)
                if value is not None:
                    family.add_metric([g.host, str(g.index)], value)
        yield from (total, healthy, allocated, jobs, reach, *per_gpu)
        from .quarantine import findings, gauge

        yield gauge(svc, findings(svc))     # GPUs wrong hold rows hold (quarantine.py)
        yield from _job_gauges(svc)
        yield from _queue_gauges(svc, hosts)


def _queue_gauges(svc, hosts: dict):
    """Pending jobs by reason, drained hosts, and teams' quota use (as `teams` shows)."""
    pending = GaugeMetricFamily("airflow_gpu_pending_jobs", "pending jobs per team and "
                                "reason code (none: not yet considered)",
                                labels=["team", "reason"])
    drained = GaugeMetricFamily("airflow_gpu_host_drained", "1 while the host is drained",
                                labels=["host"])
    quota = GaugeMetricFamily("airflow_gpu_team_quota_gpus", "GPUs guaranteed to the team",
                              labels=["team"])
    held = GaugeMetricFamily("airflow_gpu_team_gpus_held", "GPUs the team's jobs hold",
                             labels=["team"])
    borrowed = GaugeMetricFamily("airflow_gpu_team_gpus_borrowed", "GPUs the team holds "
                                 "beyond its guarantee", labels=["team"])
    # an alert's own series: 0 for a team with jobs waiting and none at risk
    at_risk = GaugeMetricFamily("airflow_gpu_deadline_at_risk_jobs", "pending jobs per team "
                                "that are expected to miss their pipeline's deadline "
                                "(reason DeadlineAtRisk)", labels=["team"])
    risky: dict[str, int] = {}
    with svc.reads() as s:
        for team, code, n in s.execute(select(JobRow.team, JobRow.reason_code, func.count())
                                       .where(JobRow.state == "pending")
                                       .group_by(JobRow.team, JobRow.reason_code)):
            pending.add_metric([team, code or "none"], n)
            risky[team] = risky.get(team, 0) + (n if code == "DeadlineAtRisk" else 0)
    for team, n in sorted(risky.items()):
        at_risk.add_metric([team], n)
    for h in svc.cluster.hosts:
        row = hosts.get(h.name)
        drained.add_metric([h.name], float(bool(row and row.drained)))
    for t in svc.teams().values():
        if t["quota_gpus"] is not None:
            quota.add_metric([t["name"]], t["quota_gpus"])
        held.add_metric([t["name"]], t["held_gpus"])
        borrowed.add_metric([t["name"]], t["borrowed_gpus"])
    yield from (pending, at_risk, drained, quota, held, borrowed)


# per-job gauges of the GPUs live jobs hold, labelled as dcgm-exporter labels its series
# (gpu, UUID, device, modelName, Hostname; hpc_job as its HPC job mapping names the job:
# a `job` label would clash with Prometheus's own) plus job_name and team
_JOB_GAUGES = (
    ("utilization_gpu", "airflow_gpu_job_gpu_utilization_percent",
     "GPU utilization of a GPU a job holds"),
    ("memory_used_bytes", "airflow_gpu_job_gpu_memory_used_bytes",
     "GPU memory in use on a GPU a job holds"),
    ("power_watts", "airflow_gpu_job_gpu_power_watts", "power draw of a GPU a job holds"),
)
_JOB_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "hpc_job", "job_name", "team"]


def _job_gauges(svc):
    families = [GaugeMetricFamily(name, text, labels=_JOB_LABELS) for _, name, text in
                _JOB_GAUGES]
    idle = GaugeMetricFamily("airflow_gpu_idle_jobs", "live jobs the idle-GPU policy has "
                             "flagged (their GPUs stay under the threshold)", labels=["team"])
    with svc.reads() as s:
        # columns of the GPUs an agent reported (no value to give for the others)
        rows = s.execute(select(
            GpuRow.index, GpuRow.uuid, GpuRow.name, GpuRow.host,
            *(getattr(GpuRow, column) for column, _, _ in _JOB_GAUGES),
            JobRow.id, JobRow.name, JobRow.team).join(
            GpuHoldRow, (GpuHoldRow.host == GpuRow.host) & (GpuHoldRow.gpu == GpuRow.index))
            .join(JobRow, JobRow.id == GpuHoldRow.job_id)
            .where(GpuRow.reported_at.is_not(None), JobRow.state.in_(LIVE))).all()
        flagged = s.execute(select(JobRow.team, func.count()).where(
            JobRow.state.in_(LIVE), JobRow.idle_flagged_at.is_not(None))
            .group_by(JobRow.team)).all()
    n = len(_JOB_GAUGES)
    for index, uuid, model, host, *rest in rows:
        values, (job_id, job_name, team) = rest[:n], rest[n:]
        labels = [str(index), uuid or "", f"nvidia{index}", model, host, job_id, job_name,
                  team]
        for family, value in zip(families, values, strict=True):
            if value is not None:
                family.add_metric(labels, value)
    for team, n in flagged:
        idle.add_metric([team], n)
    yield from (*families, idle)
