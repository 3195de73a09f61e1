"""Prometheus metrics. Gauges are read from the store at scrape time (any replica answers
the same); counters and the pass-duration histogram count what this process did."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from ..store.models import GpuHoldRow, GpuRow, JobRow


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
        self.registry.register(_StoreCollector(service))


class _StoreCollector:
    def __init__(self, service):
        self.service = service

    def collect(self):
        svc = self.service
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
        for h in svc.cluster.hosts:
            bad = unhealthy.get(h.name, 0)
            total.add_metric([h.name], h.type.n_gpus)
            healthy.add_metric([h.name], h.type.n_gpus - bad)
            allocated.add_metric([h.name], held.get(h.name, 0))
        for team, state, n in counts:
            jobs.add_metric([team, state], n)
        yield from (total, healthy, allocated, jobs)
