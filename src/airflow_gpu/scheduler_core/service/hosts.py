"""Hosts: the cluster file's hosts in the store, node agents' registrations and reports
(health, utilization, wear, usage), drain and resume, and the cluster view."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace

from sqlalchemy import bindparam, select, update

from ..engine.nvlink_groups import nvlink_groups
from ..errors import InputError
from ..store.bulk import update_rows
from ..store.models import GpuHoldRow, GpuRow, HostRow, JobRow, MigHoldRow, ReservationRow
from .common import LIVE, UTILIZATION, Principal, _ts, utcnow
from .errors import Forbidden, NotFound
from .uow import Store

_HOSTS, _GPUS = HostRow.__table__, GpuRow.__table__
# built once: a report is a few statements, building them would cost as much
_HOST_GPUS = (select(_HOSTS.c.registered_at, _HOSTS.c.reported_at, _GPUS.c.index,
                     _GPUS.c.name, _GPUS.c.healthy, _GPUS.c.health_reason,
                     _GPUS.c.ecc_corrected_total, _GPUS.c.nvlink_errors_total)
              .select_from(_HOSTS).outerjoin(_GPUS, _GPUS.c.host == _HOSTS.c.name)
              .where(_HOSTS.c.name == bindparam("name")).order_by(_GPUS.c.index))
_SET_HOST = update(_HOSTS).where(_HOSTS.c.name == bindparam("b_name"))
# PostgreSQL stamps the host in the same statement: the update returns the row as it
# was (a self-join reads it before the update), which the read needs
_OLD = _HOSTS.alias("old")
_STAMPED = (update(_HOSTS).where(_HOSTS.c.name == _OLD.c.name,
                                 _OLD.c.name == bindparam("b_name"))
            .values(reported_at=bindparam("b_now"))
            .returning(_OLD.c.name, _OLD.c.registered_at, _OLD.c.reported_at).cte("h"))
_STAMP_HOST_GPUS = (select(_STAMPED.c.registered_at, _STAMPED.c.reported_at,
                           *list(_HOST_GPUS.selected_columns)[2:])
                    .select_from(_STAMPED).outerjoin(_GPUS, _GPUS.c.host == _STAMPED.c.name)
                    .order_by(_GPUS.c.index))


def sync_hosts(svc: Store) -> None:
    """Hosts of the cluster file into the store; drain and health are kept."""
    with svc.sessions.begin() as s:
        known = {h.name: h for h in s.scalars(select(HostRow))}
        for h in svc.cluster.hosts:
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
        for h in svc.cluster.hosts:
            t = h.type
            s.add_all(GpuRow(host=h.name, index=i, name=t.gpu_name[i],
                             memory_bytes=t.gpu_mem[i], numa_node=t.numa_ids[t.gpu_numa[i]],
                             healthy=True) for i in range(t.n_gpus)
                      if (h.name, i) not in gpus)


def register_host(svc: Store, name: str, who: Principal, topology, reg: dict) -> dict:
    """A node agent registers its host's model; the host joins the cluster (or its
    declared model is replaced) and counts as reporting. Returns its cluster view."""
    from .agents import register

    if not who.admin:
        raise Forbidden("only a node agent's token (airflow-gpu token create --agent --host "
                        f"{name}) or an admin token registers hosts")
    register(svc, name, topology, reg, utcnow(), who)
    svc.refresh_cluster(force=True)
    svc.wake.set()
    return host_view(svc, name)


def forget_host(svc: Store, name: str, who: Principal) -> None:
    from .agents import forget

    if not who.admin:
        raise Forbidden("only admins remove a host's node agent registration")
    forget(svc, name)
    svc.refresh_cluster(force=True)
    svc.wake.set()


@dataclass(slots=True)
class GpuHealth:
    """A GPU's health as a report left it: what the report is answered with."""

    index: int
    name: str
    healthy: bool
    health_reason: str | None


def report_gpus(svc: Store, name: str, who: Principal, gpus: list[dict]) -> list[GpuHealth]:
    """Health and utilization of a host's GPUs, as its node agent (or an admin) reports
    it (a heartbeat of the host). An unhealthy GPU gets no new work; jobs on it are
    handled by their class's on_gpu_failure policy (faults.py). Returns the health of
    every GPU of the host, by index."""
    from .accounting import record
    from .faults import handle_gpu_faults
    from .idle import evaluate, rule_of

    if not who.admin:
        raise Forbidden("only a node agent's token (airflow-gpu token create --agent --host "
                        f"{name}) or an admin token reports host health")
    host = svc.cluster.by_name.get(name)
    if host is None:
        svc.refresh_cluster(force=True)
        host = svc.cluster.by_name.get(name)
    if host is None:
        raise NotFound(f"host {name!r} is not in the cluster; its node agent registers "
                       "it (PUT /api/v1/hosts/{name})")
    for g in gpus:
        if not 0 <= g["index"] < host.type.n_gpus:
            raise InputError(f"gpus[].index: {g['index']} is not a GPU of {name} "
                             f"(it has GPUs 0-{host.type.n_gpus - 1})")
    now = utcnow()
    with svc.sessions.begin() as s:
        stored, changed = _health(svc, s, name, gpus, now)
        # only an unhealthy GPU can have jobs to act on
        if not all(g.healthy for g in stored) and handle_gpu_faults(svc, s, now, host=name):
            changed = True
        if evaluate(svc, s, record(svc, s, name, gpus, now, rule_of), now):
            changed = True
    # passes read health, reachability and jobs' states, not utilization: a routine
    # report leaves the loop to its interval (a fleet's reports would keep it passing)
    if changed:
        svc.wake.set()
    return stored


def _health(svc: Store, s, name: str, gpus: list[dict],
            now: datetime) -> tuple[list[GpuHealth], bool]:
    """Take a report's health, utilization and wear into the host's GPU rows (one read,
    one bulk update); events for the host coming back and GPUs changing health. Returns
    the host's GPUs, and whether any of that happened."""
    from .agents import reachable
    from .wear import wear

    conn = s.connection()
    stamped = conn.dialect.name == "postgresql"
    rows = (conn.execute(_STAMP_HOST_GPUS, {"b_name": name, "b_now": now}) if stamped
            else conn.execute(_HOST_GPUS, {"name": name})).all()
    changed = bool(rows) and not reachable(rows[0], svc.settings.host_timeout, _ts(now))
    if changed:
        svc._event(s, "host", f"host {name} is reachable again: its node agent "
                   "reported", host=name)
    health = {r.index: GpuHealth(r.index, r.name, r.healthy, r.health_reason)
              for r in rows if r.index is not None}
    # the error counters wear() compares, as they stand
    counters = {r.index: SimpleNamespace(ecc_corrected_total=r.ecc_corrected_total,
                                         nvlink_errors_total=r.nvlink_errors_total)
                for r in rows if r.index is not None}
    groups: dict[tuple, list[dict]] = {}     # one statement per set of columns
    for g in gpus:
        gpu = health.get(g["index"])
        if gpu is None:                      # no such row: nothing to update
            continue
        if gpu.healthy != g["healthy"]:
            changed = True
            svc._event(s, "health", f"GPU {name}:{g['index']} "
                       f"{'healthy' if g['healthy'] else 'unhealthy'}"
                       + (f" ({g.get('reason')})" if g.get("reason") else ""),
                       host=name)
        gpu.healthy, gpu.health_reason = g["healthy"], g.get("reason")
        wear(counters[gpu.index], g, now)
        values = {"host": name, "index": gpu.index, "healthy": gpu.healthy,
                  "health_reason": gpu.health_reason,
                  **{k: g[k] for k in UTILIZATION if k in g}, **vars(counters[gpu.index])}
        groups.setdefault(tuple(values), []).append(values)
    for rows in groups.values():
        update_rows(conn, _GPUS, ("host", "index"), rows, {"reported_at": now})
    if not stamped:
        conn.execute(_SET_HOST, {"b_name": name, "reported_at": now})
    return [health[i] for i in sorted(health)], changed


def set_drained(svc: Store, name: str, drained: bool, who: Principal,
                reason: str | None = None) -> HostRow:
    """Drain (with why: shown in the cluster view and in pending reasons that name
    the host) or resume a host; resuming clears the reason."""
    return set_drained_many(svc, [name], drained, who, reason)[0]


def set_drained_many(svc: Store, names: list[str], drained: bool, who: Principal,
                     reason: str | None = None) -> list[HostRow]:
    """set_drained for each host named, in one transaction: all or none (NotFound naming
    every host the cluster does not have)."""
    if not who.admin:
        raise Forbidden("only admins drain or resume hosts")
    with svc.sessions.begin() as s:
        rows = {r.name: r for r in s.scalars(select(HostRow).where(HostRow.name.in_(names)))}
        unknown = [n for n in names if n not in rows]
        if len(names) == 1 and unknown:
            raise NotFound(f"host {names[0]!r} is not in the cluster")
        if unknown:
            shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more"
                                              if len(unknown) > 8 else "")
            raise NotFound(f"hosts: {shown} {'is' if len(unknown) == 1 else 'are'} not in "
                           f"the cluster; nothing was {'drained' if drained else 'resumed'} "
                           "(airflow-gpu cluster lists the hosts)")
        for name in names:
            row = rows[name]
            if drained and (not row.drained or reason):
                row.drained_at = utcnow() if not row.drained else row.drained_at
                row.drain_reason = reason or (row.drain_reason if row.drained else None)
                row.drained_by = who.team
            elif not drained:
                row.drain_reason = row.drained_at = row.drained_by = None
            row.drained = drained
            svc._event(s, "host", f"host {name} {'drained' if drained else 'resumed'}"
                       + (f" (reason: {reason})" if drained and reason else ""), host=name)
    svc.wake.set()
    return [rows[n] for n in names]


def host_view(svc: Store, name: str) -> dict:
    found = cluster_view(svc, only=name)["hosts"]
    if not found:
        raise NotFound(f"host {name!r} is not in the cluster")
    return found[0]


def cluster_view(svc: Store, only: str | None = None) -> dict:
    """Hosts (all, or the one named `only`), their GPUs' health, utilization and
    holders, and whether each host's node agent is reporting."""
    from .agents import reachable
    from .wear import reasons as wear_reasons

    svc.refresh_cluster()
    cluster, now = svc.cluster, time.time()
    at = datetime.fromtimestamp(now, UTC)     # the same instant, for wear's window
    with svc.reads() as s:
        hosts = {h.name: h for h in s.scalars(select(HostRow).where(
            *([HostRow.name == only] if only else [])))}
        health = {(g.host, g.index): g for g in s.scalars(select(GpuRow))}
        holds = {(g.host, g.gpu): g.job_id for g in s.scalars(select(GpuHoldRow))}
        mig_holds = {(m.host, m.gpu, m.device): m.job_id
                     for m in s.scalars(select(MigHoldRow))}
        jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.state.in_(LIVE)))}
        windows = list(s.scalars(select(ReservationRow).where(ReservationRow.end_at > at)
                                 .order_by(ReservationRow.start_at)))
    from .clusterview import mig_view, reserved_now_and_next

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
        up = not (row and row.drained) and reachable(row, svc.settings.host_timeout, now)
        out.append({"name": h.name, "model": h.type.model, "rack": h.rack,
                    "switch": h.switch, "nvlink_domain": h.nvlink_domain,
                    "docker_url": h.docker_url,
                    "address": h.address or h.name, "drained": bool(row and row.drained),
                    "drain_reason": row.drain_reason if row and row.drained else None,
                    "drained_at": row.drained_at if row and row.drained else None,
                    "drained_by": row.drained_by if row and row.drained else None,
                    "reachable": reachable(row, svc.settings.host_timeout, now),
                    "last_report_at": row.reported_at if row else None,
                    "agent": bool(row and row.registered_at),
                    "nvlink": {"fabric": h.type.fabric,
                               "groups": nvlink_groups(h.type.links)},
                    "gpus": gpus,
                    # the admins' reservation of the host now, and its next one
                    "reservations": reserved_now_and_next(windows, h.name, at),
                    # drained and unreachable hosts' GPUs are never free
                    "free_gpus": sum(1 for x in gpus if x["job"] is None and x["healthy"]
                                     and not x.get("mig_mode")) if up else 0})
    from .clusterview import add_allocation
    from .reservations import view as reservation_view

    return add_allocation(svc, {"cluster": cluster.name, "hosts": out,
                                "gpus_total": sum(len(h["gpus"]) for h in out),
                                "gpus_allocated": len(holds),
                                "reservations": [reservation_view(w, at) for w in windows]})
