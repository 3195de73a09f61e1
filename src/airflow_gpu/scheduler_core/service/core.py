"""The service over the store, as one object: `Service` is the unit of work (uow.Store)
with a method per operation, each delegating to the module that owns the resource:
jobs.py (submit, read, cancel, finish, heartbeat), hosts.py (hosts, node agents, drain,
the cluster view), teams.py (shares and quotas) and storepass.py (the scheduling pass).

Those modules import the leaves (common.py, errors.py, uow.py), never this one, so the
imports run one way. The names code outside the service imported from here stay here.
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from ..jobspec import JobSpec
from ..plugins import Registry
from ..store.models import AllocationRow, EventRow, HostRow, JobRow
from . import hosts, jobs, reservations, teams
from .common import (
    ENDED,
    LIVE,
    PENDING,
    Principal,
    _columns,
    _ts,
    eta_seconds,
    same_job,
    spec_gpus,
    utcnow,
)
from .errors import Conflict, Forbidden, NotFound
from .uow import Settings, Store

__all__ = [   # what code outside the service imports from here
    "ENDED", "LIVE", "PENDING", "Conflict", "Forbidden", "NotFound", "Principal", "Service",
    "Settings", "_columns", "_ts", "eta_seconds", "same_job", "spec_gpus", "utcnow",
]


class Service(Store):
    def __init__(self, settings: Settings, reg: Registry | None = None):
        super().__init__(settings, reg)
        self.refresh_cluster(force=True)
        try:
            self.sync_hosts()
        except IntegrityError:   # a replica starting beside this one added them first
            self.sync_hosts()

    # -- hosts (hosts.py) -------------------------------------------------------------------
    def sync_hosts(self) -> None:
        hosts.sync_hosts(self)

    def register_host(self, name: str, who: Principal, topology, reg: dict) -> dict:
        return hosts.register_host(self, name, who, topology, reg)

    def forget_host(self, name: str, who: Principal) -> None:
        hosts.forget_host(self, name, who)

    def report_gpus(self, name: str, who: Principal, gpus: list[dict]) -> list[hosts.GpuHealth]:
        return hosts.report_gpus(self, name, who, gpus)

    def set_drained(self, name: str, drained: bool, who: Principal,
                    reason: str | None = None) -> HostRow:
        return hosts.set_drained(self, name, drained, who, reason)

    def set_drained_many(self, names: list[str], drained: bool, who: Principal,
                         reason: str | None = None) -> list[HostRow]:
        return hosts.set_drained_many(self, names, drained, who, reason)

    def host_view(self, name: str) -> dict:
        return hosts.host_view(self, name)

    def cluster_view(self, only: str | None = None) -> dict:
        return hosts.cluster_view(self, only)

    # -- teams (teams.py) -------------------------------------------------------------------
    def set_team(self, name: str, who: Principal, share: float | None,
                 quota_gpus: int | None, borrow_gpus: int | None = None,
                 webhook: dict | None = None, shares: bool = True) -> dict:
        return teams.set_team(self, name, who, share, quota_gpus, borrow_gpus, webhook,
                              shares)

    def teams(self) -> dict[str, dict]:
        return teams.teams(self)

    # -- admins' reservations (reservations.py) ---------------------------------------------
    def create_reservation(self, who: Principal, **fields) -> tuple[dict, list[dict]]:
        return reservations.create(self, who, **fields)

    def update_reservation(self, who: Principal, name: str, **fields
                           ) -> tuple[dict, list[dict]]:
        return reservations.update(self, who, name, **fields)

    def delete_reservation(self, who: Principal, name: str) -> dict:
        return reservations.remove(self, who, name)

    def reservations(self, include_ended: bool = False) -> list[dict]:
        return reservations.listing(self, include_ended)

    def reservation(self, name: str) -> dict:
        return reservations.one(self, name)

    # -- jobs (jobs.py) ---------------------------------------------------------------------
    def submit(self, spec: JobSpec, who: Principal,
               key: str | None = None) -> tuple[JobRow, bool]:
        return jobs.submit(self, spec, who, key)

    def job_row(self, spec: JobSpec, who: Principal, key: str | None = None) -> JobRow:
        return jobs.job_row(self, spec, who, key)

    def list_jobs(self, state: str | None = None, team: str | None = None,
                  limit: int = 1000, name: str | None = None,
                  newest_first: bool = False) -> list[JobRow]:
        return jobs.list_jobs(self, state, team, limit, name, newest_first)

    def allocations(self, job_id: str) -> list[AllocationRow]:
        return jobs.allocations(self, job_id)

    def live_allocations(self, job_ids: list[str]) -> dict[str, list[AllocationRow]]:
        return jobs.live_allocations(self, job_ids)

    def events(self, job_id: str) -> list[EventRow]:
        return jobs.events(self, job_id)

    def cancel(self, job_id: str, who: Principal) -> JobRow:
        return jobs.cancel(self, job_id, who)

    def finish(self, job_id: str, who: Principal, outcome: str,
               exit_code: int | None, attempt: int | None = None) -> JobRow:
        return jobs.finish(self, job_id, who, outcome, exit_code, attempt)

    def heartbeat(self, job_id: str, who: Principal, attempt: int | None = None
                  ) -> tuple[JobRow, list[AllocationRow]]:
        """The job after its launcher's heartbeat, and its allocations."""
        return jobs.heartbeat(self, job_id, who, attempt)

    # -- the scheduling pass (storepass.py) ---------------------------------------------------
    def slowdown_view(self) -> dict:
        """The locality slowdown the passes plan with, as learned so far."""
        with self.reads() as s:
            self.slowdown.update(s, self._policy(), self.cluster)
        return self.slowdown.report()

    def schedule_pass(self, explain: bool = True) -> list[str]:
        """One pass of the engine on the committed state; returns the admitted job ids.
        `explain`: work out and write why each job waits (else they stay as written)."""
        from .storepass import run_pass

        return run_pass(self, explain)
