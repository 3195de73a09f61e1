"""What the cluster view adds for `airflow-gpu cluster` (Slurm's sinfo and scontrol show
node, Grid Engine's qhost): GPUs, cores and memory allocated per host and per NUMA node,
from the live allocations, and the totals; GPUs on drained or unreachable hosts, and
unhealthy ones, and those a wrong hold row holds (quarantine.py), are counted
unavailable, never free. A GPU in MIG mode with a device held counts as allocated; its
devices, their holders and free slices are listed with it."""

from __future__ import annotations

from fractions import Fraction

from sqlalchemy import select

from ..engine.mig import GPU_COMPUTE_SLICES, gpu_share
from ..store.models import AllocationRow, JobRow, MigHoldRow


def add_allocation(svc, view: dict) -> dict:
    """`view` (core.Service.cluster_view) with per host `cpus_total`, `cpus_allocated`,
    `memory_total`, `memory_allocated` (bytes), `gpus_allocated`, `gpus_unavailable` and
    `numa` (per NUMA node: its GPUs, and the same counts), and the cluster's totals."""
    names = {h["name"] for h in view["hosts"]}
    with svc.reads() as s:
        allocs = [a for a in s.scalars(select(AllocationRow).where(
            AllocationRow.live.is_(True))) if a.host in names]
    by_host: dict[str, list[AllocationRow]] = {}
    for a in allocs:
        by_host.setdefault(a.host, []).append(a)
    cluster = svc.cluster
    from .quarantine import findings, gpus_by_host, listing

    found = [f for f in findings(svc) if f.host in names]    # wrong hold rows
    quarantined = gpus_by_host(found, cluster)
    for h in view["hosts"]:
        host = cluster.by_name.get(h["name"])
        if host is None:
            continue
        q = quarantined.get(h["name"], {})
        for g in h["gpus"]:
            g["quarantined"] = q.get(g["index"])
        h["quarantined"] = listing([f for f in found if f.host == h["name"]])
        t = host.type
        pos_of_cpu = {}
        for p, mask in enumerate(t.numa_cpus):
            for c in range(mask.bit_length()):
                if mask >> c & 1:
                    pos_of_cpu[c] = p
        numa = [{"node": t.numa_ids[p], "gpus": [g for g in range(t.n_gpus)
                                                 if t.gpu_numa[g] == p],
                 "gpus_allocated": 0, "cpus_total": t.numa_cpus[p].bit_count(),
                 "cpus_allocated": 0, "memory_total": t.numa_mem[p], "memory_allocated": 0}
                for p in range(len(t.numa_ids))]
        by_id = {n["node"]: n for n in numa}
        mig_used = {g["index"] for g in h["gpus"] if any(m["job"] for m in g.get("mig", ()))}
        for g in mig_used:       # a MIG GPU with a device held is allocated (in part)
            numa[t.gpu_numa[g]]["gpus_allocated"] += 1
        for a in by_host.get(h["name"], []):
            for g in a.gpus:
                if 0 <= g < t.n_gpus:
                    numa[t.gpu_numa[g]]["gpus_allocated"] += 1
            for c in a.cpus:
                if c in pos_of_cpu:
                    numa[pos_of_cpu[c]]["cpus_allocated"] += 1
            for node, b in (a.memory_by_numa or {}).items():
                if int(node) in by_id:
                    by_id[int(node)]["memory_allocated"] += int(b)
        up = not h["drained"] and h.get("reachable", True)
        h.update(
            gpus_allocated=sum(n["gpus_allocated"] for n in numa),
            gpus_unavailable=sum(1 for g in h["gpus"] if g["job"] is None and (
                not up or not g["healthy"]) or g["quarantined"] and not g.get("mig_mode")),
            cpus_total=t.total_cpus, cpus_allocated=sum(n["cpus_allocated"] for n in numa),
            memory_total=t.total_mem,
            memory_allocated=sum(n["memory_allocated"] for n in numa), numa=numa,
            **mig_counts(h["gpus"]))
    hosts = view["hosts"]
    view.update(
        gpus_allocated=sum(h.get("gpus_allocated", 0) for h in hosts),
        mig_devices=sum(h.get("mig_devices", 0) for h in hosts),
        mig_devices_held=sum(h.get("mig_devices_held", 0) for h in hosts),
        mig_gpus_held=round(sum(h.get("mig_gpus_held", 0) for h in hosts), 4),
        gpus_free=sum(h["free_gpus"] for h in hosts),
        gpus_unavailable=sum(h.get("gpus_unavailable", 0) for h in hosts),
        quarantined=listing(found),
        cpus_total=sum(h.get("cpus_total", 0) for h in hosts),
        cpus_allocated=sum(h.get("cpus_allocated", 0) for h in hosts),
        memory_total=sum(h.get("memory_total", 0) for h in hosts),
        memory_allocated=sum(h.get("memory_allocated", 0) for h in hosts),
        drained_hosts=[{"name": h["name"], "reason": h.get("drain_reason"),
                        "since": h.get("drained_at"), "by": h.get("drained_by")}
                       for h in hosts if h["drained"]])
    return view


def mig_counts(gpus: list[dict]) -> dict:
    """A host's MIG devices: how many, how many held, the GPUs' share held (compute slices
    / 7, as quotas charge it); per GPU in MIG mode its free compute slices (those of its
    free devices) and devices held. {} for a host without MIG."""
    total = held = 0
    share = Fraction(0)
    for g in gpus:
        if not g.get("mig_mode"):
            continue
        used = [m for m in g["mig"] if m["job"]]
        g["mig_held"] = len(used)
        g["mig_free_slices"] = int(sum(gpu_share(m["profile"]) * GPU_COMPUTE_SLICES
                                       for m in g["mig"] if not m["job"]))
        total, held = total + len(g["mig"]), held + len(used)
        share += sum((gpu_share(m["profile"]) for m in used), Fraction(0))
    if not total:
        return {}
    return {"mig_devices": total, "mig_devices_held": held,
            "mig_gpus_held": round(float(share), 4)}


def mig_shares(cluster, s, in_reservation: bool | None = None) -> dict[str, Fraction]:
    """Per team, the GPU share of the MIG devices its live jobs hold (gpu_share each);
    `in_reservation`: only those of jobs inside (True) or outside (False) a reservation."""
    profile = {(h.name, x.gpu, x.index): x.profile for h in cluster.hosts if h.type.mig
               for x in h.type.mig.slices}
    out: dict[str, Fraction] = {}
    q = (select(MigHoldRow.host, MigHoldRow.gpu, MigHoldRow.device, JobRow.team)
         .join(JobRow, JobRow.id == MigHoldRow.job_id))
    if in_reservation is not None:
        q = q.where(JobRow.reservation.is_not(None) if in_reservation
                    else JobRow.reservation.is_(None))
    for host, gpu, device, team in s.execute(q):
        name = profile.get((host, gpu, device))
        if name:
            out[team] = out.get(team, Fraction(0)) + gpu_share(name)
    return out


def mig_view(t, gpu: int, host: str, holds: dict, jobs: dict) -> dict:
    """A GPU in MIG mode in the cluster view: its MIG devices and who holds each, job and
    team as for a whole GPU (it is never free whole); {} for a GPU that is not."""
    if not t.mig_gpus >> gpu & 1:
        return {}
    out = []
    for s in t.mig.slices:
        if s.gpu == gpu:
            job = holds.get((host, gpu, s.index))
            out.append({**s.to_dict(), "job": job,
                        "team": jobs[job].team if job in jobs else None})
    return {"mig_mode": True, "mig": out}


def reserved_now_and_next(windows: list, host: str, at) -> list[dict]:
    """The admins' reservation holding `host` now, and the next one to (from `windows`,
    the reservations that have not ended, by start)."""
    from .reservations import _utc, state_of

    out = []
    for w in windows:
        if host in w.hosts:
            out.append({"name": w.name, "maint": bool(w.maint), "teams": list(w.teams or ()),
                        "start": _utc(w.start_at), "end": _utc(w.end_at),
                        "state": state_of(w, at)})
            if out[-1]["state"] == "upcoming" or len(out) == 2:
                break
    return out
