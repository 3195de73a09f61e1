"""Hosts that node agents register. An agent sends its host's model (a gpu-topology/v1
document, discovered or declared); the service keeps it with the host, and the cluster
it schedules on is the cluster file's hosts plus the registered ones. A registered model
replaces a file host's declared one (what NVML reports wins); the file keeps the last
word on rack, switch and labels.

An agent token registers only the cluster file's hosts and hosts already registered,
unless an admin let it add new ones (`--allow-new-hosts`): a name it may merely serve
("dgx-*") does not put a host into the cluster. Admin tokens register any host. While
jobs run on a host, neither its model nor its launch addresses (docker_url, address) may
change (409, with an event); on an idle host they may, and an event says so.

A host whose agent has reported once and then stays silent longer than `host_timeout`
is unreachable: it gets no new work until it reports again. Hosts that never had an
agent are never unreachable."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..engine.cluster import Cluster, Host
from ..engine.hosttype import HostType, host_type
from ..engine.mig import has_mig_report, mig_slots, with_layout
from ..engine.migconfig import declared_layouts
from ..engine.state import ClusterState
from ..engine.topology import Topology
from ..errors import InputError
from ..store.models import AllocationRow, EventRow, GpuRow, HostRow

log = logging.getLogger(__name__)

MAX_GPUS = 64               # GPU indexes a host report may name (0-63)
RECHECK = 1.0               # seconds between checks for hosts registered elsewhere


def topology_hash(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def refresh(svc, force: bool = False) -> None:
    """Rebuild `svc.cluster` when the registered hosts changed (in this process or another
    replica); checked at most once a second unless `force`."""
    if not force and time.monotonic() - svc._cluster_checked < RECHECK:
        return
    with svc._cluster_lock:
        svc._cluster_checked = time.monotonic()
        with svc.reads() as s:
            rows = s.execute(select(
                HostRow.name, HostRow.topology_hash, HostRow.rack, HostRow.switch,
                HostRow.docker_url, HostRow.address, HostRow.labels).where(
                HostRow.topology_hash.is_not(None)).order_by(HostRow.name)).all()
            sig = tuple((*r[:6], json.dumps(r.labels, sort_keys=True)) for r in rows)
            if sig == svc._cluster_sig:
                return
            hashes = {r.topology_hash for r in rows}
            missing = hashes - svc._models.keys()
            for h, doc in s.execute(select(HostRow.topology_hash, HostRow.topology).where(
                    HostRow.topology_hash.in_(missing))) if missing else ():
                try:
                    svc._models.setdefault(h, Topology.model_validate(doc))
                except ValueError as exc:      # stored by an older version, say
                    log.error("a registered host model cannot be used: %s", exc)
        svc._models = {h: t for h, t in svc._models.items() if h in hashes}
        svc.cluster = compose(svc.settings.cluster, rows, svc._models)
        svc._empty, svc._never = ClusterState(svc.cluster), {}
        svc._cluster_sig = sig


def compose(file: Cluster, rows, models: dict[str, Topology]) -> Cluster:
    """The cluster file's hosts (with registered models where an agent sent one), then the
    hosts only agents know, by name."""
    regs = {r.name: r for r in rows if r.topology_hash in models}
    hosts: list[Host] = []
    for h in file.hosts:
        r = regs.pop(h.name, None)
        htype = _registered_type(h, models[r.topology_hash]) if r else h.type
        hosts.append(Host(len(hosts), h.name, htype, h.rack, h.switch,
                          h.docker_url or (r and r.docker_url),
                          {**((r and r.labels) or {}), **h.labels},
                          h.address or (r and r.address), h.nvlink_domain))
    for name, r in sorted(regs.items()):
        hosts.append(Host(len(hosts), name, host_type(models[r.topology_hash]), r.rack,
                          r.switch, r.docker_url, dict(r.labels or {}), r.address))
    return Cluster(file.name, hosts)


def _registered_type(h: Host, topo: Topology) -> HostType:
    """A file host's registered model: the agent's wins, but one that says nothing of
    MIG (an agent in declared mode) keeps the cluster file's MIG layout."""
    declared = declared_layouts(h.type.topo)
    if declared and not has_mig_report(topo):
        try:
            topo = with_layout(topo, declared)
        except ValueError as exc:
            log.error("host %s: the cluster file's MIG layout does not fit the model its "
                      "agent registered (%s); scheduling it without MIG", h.name, exc)
    return host_type(topo)


def _misfit(t: HostType, live: list[AllocationRow]) -> str | None:
    """What of the live allocations on a host the new model cannot hold, if anything."""
    cpus = 0
    for m in t.numa_cpus:
        cpus |= m
    for a in live:
        gpus = [g for g in a.gpus if g >= t.n_gpus]
        lost = [c for c in a.cpus if not cpus >> c & 1]
        numa = [n for n in a.memory_by_numa if int(n) not in t.numa_ids]
        mig = [m["label"] for m in a.mig or () if not mig_slots(t.mig, [m])]
        if gpus or lost or numa or mig:
            return (f"job {a.job_id} holds " + ", ".join(
                f"{what} {','.join(map(str, xs))}" for what, xs in
                (("GPUs", gpus), ("CPUs", lost), ("NUMA nodes", numa),
                 ("MIG devices", mig)) if xs)
                + " that the new model does not have")
    return None


def _current(svc, name: str, row: HostRow | None) -> HostType | None:
    """The model host `name` is scheduled with: its registered one, else the file's."""
    if row is not None and row.topology is not None:
        topo = svc._models.get(row.topology_hash)
        if topo is None:
            try:
                topo = Topology.model_validate(row.topology)
            except ValueError:           # stored by an older version, say
                topo = None
        if topo is not None:
            return host_type(topo)
    h = svc.settings.cluster.by_name.get(name)
    return h.type if h else None


def _launch(svc, name: str, row: HostRow | None, reg: dict | None = None) -> dict:
    """The launch addresses host `name` is scheduled with, or would be with registration
    `reg` ({}: none): the cluster file's where it gives one, else the agent's (compose)."""
    from .hostdiff import LAUNCH

    fh = svc.settings.cluster.by_name.get(name)
    regd = row is not None and row.topology_hash is not None
    return {k: (fh and getattr(fh, k)) or (reg.get(k) if reg is not None
                                          else getattr(row, k) if regd else None)
            for k in LAUNCH}


def _busy_change(svc, name: str, row: HostRow | None, t: HostType,
                 live: list[AllocationRow], forgetting: bool = False,
                 moved: list[str] | tuple = ()) -> str | None:
    """Why registering `t` for a host with live allocations is refused, if it is: its
    jobs were placed on the current model's GPUs, NUMA nodes and NICs and launched at its
    addresses (`moved`: how these would change), so none of these may change under them
    (nor may the new model lack what they hold). With `forgetting`, `t` is the cluster
    file's model that removing the registration would bring back."""
    if not live:
        return None
    from .hostdiff import changes

    current = _current(svc, name, row)
    diff = (changes(current, t) if current is not None else []) + list(moved)
    misfit = _misfit(t, live)
    if not diff and not misfit:
        return None
    jobs = list(dict.fromkeys(a.job_id for a in live))
    shown = ", ".join(jobs[:5]) + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")
    was = f" (scheduled as {current.describe()})" if current is not None else ""
    what = (f"removing its node agent's registration would bring back the cluster file's "
            f"model, {t.describe()}" if forgetting
            else f"its node agent now reports {t.describe()}")
    fix = ("then remove the registration" if forgetting else
           "then restart the agent (a running agent retries and the new model applies once "
           "the host is empty)")
    return (f"host {name}{was}: {what}, but "
            f"job{'s' if len(jobs) > 1 else ''} {shown} run{'' if len(jobs) > 1 else 's'} "
            "there, placed on the current model; what would change: "
            + "; ".join(diff + ([misfit] if misfit else []))
            + f". To apply it, drain the host (airflow-gpu drain {name}), let its jobs end, "
            + fix)


def _sync_gpus(s: Session, name: str, t: HostType) -> None:
    rows = {g.index: g for g in s.scalars(select(GpuRow).where(GpuRow.host == name))}
    for i in range(t.n_gpus):
        row = rows.get(i)
        if row is None:
            s.add(GpuRow(host=name, index=i, name=t.gpu_name[i], memory_bytes=t.gpu_mem[i],
                         numa_node=t.numa_ids[t.gpu_numa[i]], healthy=True))
        else:
            row.name, row.memory_bytes = t.gpu_name[i], t.gpu_mem[i]
            row.numa_node = t.numa_ids[t.gpu_numa[i]]
    s.execute(delete(GpuRow).where(GpuRow.host == name, GpuRow.index >= t.n_gpus))


def _refuse_new(name: str, who) -> None:
    """403 unless `who` (an agent token's principal) may add host `name` to the cluster."""
    from .auth import AgentPrincipal
    from .errors import Forbidden

    if not isinstance(who, AgentPrincipal) or who.may_add(name):
        return
    may = (f"may add only hosts matching {', '.join(who.new_hosts)}" if who.new_hosts
           else "may register only the cluster file's hosts and registered ones")
    raise Forbidden(
        f"host {name} is not in the cluster file and was never registered, and agent "
        f"token {who.token_id} (hosts {who.describe()}) {may}: add {name} to the "
        f"cluster file (and restart the service), or have an admin create the agent's token with "
        f"--allow-new-hosts (airflow-gpu token create --agent --host {name} "
        f"--allow-new-hosts {name})")


def _refused(svc, name: str, problem: str) -> None:
    """Log a refused registration, and record it as the host's event unless its last
    event says the same already (a refused agent retries every interval)."""
    log.warning("%s", problem)
    message = f"registration refused: {problem}"
    with svc.sessions.begin() as s:
        last = s.scalars(select(EventRow.message).where(EventRow.host == name)
                         .order_by(EventRow.id.desc()).limit(1)).first()
        if last != message:
            svc._event(s, "host", message, host=name)


def register(svc, name: str, topo: Topology, reg: dict, now: datetime,
             who=None) -> None:
    """Store the agent's model of host `name` (and its rack, switch... for hosts the
    cluster file does not list); `who`: the token's principal (an agent's adds hosts only
    as it was allowed to)."""
    from .errors import Conflict

    if len(topo.gpus) > MAX_GPUS:
        raise InputError(f"topology.gpus: {len(topo.gpus)} GPUs; a host may have at most "
                         f"{MAX_GPUS}")
    try:
        t = host_type(topo)
    except (ValueError, KeyError, IndexError, OverflowError) as exc:
        raise InputError(f"topology: the model cannot be compiled ({exc}); check "
                         "host.numa_nodes, gpus and pcie_switches") from None
    in_file = name in svc.settings.cluster.by_name
    try:
        _store(svc, name, topo, t, reg, now, who, in_file)
    except Conflict as exc:          # recorded apart: the registration's own is undone
        _refused(svc, name, str(exc))
        raise


def _store(svc, name: str, topo: Topology, t: HostType, reg: dict, now: datetime, who,
           in_file: bool) -> None:
    from .errors import Conflict
    from .hostdiff import launch_changes

    doc = topo.document()
    with svc.sessions.begin() as s:
        live = list(s.scalars(select(AllocationRow).where(
            AllocationRow.host == name, AllocationRow.live.is_(True))))
        row = s.get(HostRow, name)
        if not in_file and (row is None or row.registered_at is None):
            _refuse_new(name, who)
        was = _launch(svc, name, row)
        moved = launch_changes(was, _launch(svc, name, row, reg))
        problem = _busy_change(svc, name, row, t, live, moved=moved)
        if problem:
            raise Conflict(problem)
        known = in_file or (row is not None and row.topology_hash is not None)
        if row is None:
            row = HostRow(name=name, drained=False, rack="default", switch="default",
                          labels={})
            s.add(row)
        if not in_file:
            row.rack, row.switch = reg.get("rack") or "default", reg.get("switch") or "default"
            row.labels = dict(reg.get("labels") or {})
        row.docker_url, row.address = reg.get("docker_url"), reg.get("address")
        row.model, row.topology, row.topology_hash = topo.model, doc, topology_hash(doc)
        row.registered_at = row.reported_at = now
        s.flush()
        _sync_gpus(s, name, t)
        svc._event(s, "host", f"host {name} registered by its node agent: {t.describe()}"
                   + ("" if in_file else f", rack {row.rack}, switch {row.switch}"), host=name)
        if moved and known:
            svc._event(s, "host", f"host {name}: its launch addresses changed (no jobs ran "
                       "there): " + "; ".join(moved), host=name)


def forget(svc, name: str) -> None:
    """Drop the agent's registration: a file host goes back to its declared model (and is
    never unreachable), a host only the agent knew leaves the cluster. Refused (409) while
    jobs run there, unless the host is in the cluster file and its declared model is the
    registered one in all the jobs were placed on, at the same launch addresses (the rule
    registrations follow)."""
    from .errors import Conflict, NotFound

    in_file = name in svc.settings.cluster.by_name
    with svc.sessions.begin() as s:
        row = s.get(HostRow, name)
        if row is None or row.registered_at is None:
            raise NotFound(f"host {name!r} has no registered node agent")
        live = list(s.scalars(select(AllocationRow).where(
            AllocationRow.host == name, AllocationRow.live.is_(True))))
        if live and not in_file:
            jobs = list(dict.fromkeys(a.job_id for a in live))
            shown = ", ".join(jobs[:5]) + (f" and {len(jobs) - 5} more"
                                           if len(jobs) > 5 else "")
            raise Conflict(f"host {name}: job{'s' if len(jobs) > 1 else ''} {shown} "
                           f"run{'' if len(jobs) > 1 else 's'} there; drain the host "
                           f"(airflow-gpu drain {name}), let its jobs end, then remove it")
        if in_file:
            from .hostdiff import launch_changes

            moved = launch_changes(_launch(svc, name, row), _launch(svc, name, row, {}))
            problem = _busy_change(svc, name, row, svc.settings.cluster.by_name[name].type,
                                   live, forgetting=True, moved=moved)
            if problem:
                log.warning("%s", problem)
                raise Conflict(problem)
        row.topology = row.topology_hash = row.registered_at = None
        if in_file:
            _sync_gpus(s, name, svc.settings.cluster.by_name[name].type)
        else:
            s.execute(delete(GpuRow).where(GpuRow.host == name))
        svc._event(s, "host", f"host {name}: its node agent's registration was removed",
                   host=name)


def silent_hosts(s: Session, timeout: float, now: datetime) -> set[str]:
    """Hosts whose agent reported before and has been silent for over `timeout` s."""
    cutoff = now - timedelta(seconds=timeout)
    return set(s.scalars(select(HostRow.name).where(
        HostRow.registered_at.is_not(None), HostRow.reported_at < cutoff)))


def reachable(row: HostRow | None, timeout: float, now: float) -> bool:
    if row is None or row.registered_at is None or row.reported_at is None:
        return True
    from .common import _ts

    return _ts(row.reported_at) >= now - timeout
