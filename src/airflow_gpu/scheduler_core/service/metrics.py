"""Prometheus metrics. Gauges are read from the store at scrape time (any replica answers
the same); counters and the pass-duration histogram count what this process did."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from ..store.models import GpuHoldRow, GpuRow, HostRow, JobRow

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
        self.registry.register(_StoreCollector(service))


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
        with svc.sessions() as s:
            unhealthy = dict(s.execute(select(GpuRow.host, func.count()).where(
                GpuRow.healthy.is_(False)).group_by(GpuRow.host)).all())
            held = dict(s.execute(select(GpuHoldRow.host, func.count())
                                  .group_by(GpuHoldRow.host)).all())
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
