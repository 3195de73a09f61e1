"""Quarantine: a GPU, MIG device or core that a wrong hold row holds (store/integrity.py:
a hold whose job has ended or is gone, or that no trusted live allocation has) gets no
new work.
Each pass finds such rows and takes what they hold from the engine's free resources, so
the pass places jobs elsewhere instead of failing on the hold table's primary key (and
every pass after with it). Nothing is stored: the cluster view, /readyz and /metrics
find the same rows when asked, on any replica. The leader writes one event when a row
turns up and one when it is gone (`airflow-gpu db repair` fixes such rows). The pass
reads them in its own snapshot (warm.py): read apart, a job admitted in between looked
wrong and its healthy GPUs were quarantined."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from ..engine.cluster import Cluster
from ..engine.state import ClusterState, ReplicaAllocation
from ..store import integrity
from ..store.integrity import Finding

log = logging.getLogger(__name__)


def reason(f: Finding) -> str:
    """Why the thing it holds is quarantined, with the fix (one line)."""
    if f.action in ("delete", "later"):
        return f"orphan hold ({f.problem}): run `airflow-gpu db repair`"
    if f.table == "allocations":
        return f"wrong allocation ({f.problem}): {f.fix}"
    if f.action in ("keep", "cancel"):
        return f"held by a live job whose allocation is wrong ({f.problem}): {f.fix}"
    return f"conflicting holds ({f.problem}): {f.fix}"


def _allocation(cluster: Cluster, f: Finding) -> ReplicaAllocation | None:
    """What the row holds as an engine allocation without a job; None when the host has
    no such thing (nothing to take) or a live job holds it already."""
    host = cluster.by_name.get(f.host)
    if host is None or not f.holds:
        return None
    t = host.type
    if f.table == "cpu_holds":
        pos = next((p for p, m in enumerate(t.numa_cpus) if f.index >= 0
                    and m >> f.index & 1), None)
        return None if pos is None else ReplicaAllocation(
            "", "", 0, host, 0, [(pos, 1 << f.index)], [])
    if not 0 <= f.index < t.n_gpus:
        return None
    if f.table == "mig_holds":
        slot = next((x.slot for x in (t.mig.slices if t.mig else ())
                     if x.gpu == f.index and x.index == f.device), None)
        return None if slot is None else ReplicaAllocation(
            "", "", 0, host, 0, [], [], slice_mask=1 << slot)
    return ReplicaAllocation("", "", 0, host, 1 << f.index, [], [])


def hold(state: ClusterState, cluster: Cluster, found: list[Finding]) -> None:
    """Take what wrong hold rows hold from the free resources of `state` (the leader's,
    built anew: warm.py)."""
    for f in found:
        a = _allocation(cluster, f)
        if a is not None:
            state.hold(a)


def tell(svc, s: Session, found: list[Finding]) -> None:
    """In a pass's write: tell each wrong hold row once (an event and a log line), and
    once when it is gone."""
    keys = set()
    for f in found:
        key = ("quarantine", f"{f.table} {f.key} job={f.job}")
        keys.add(key)
        message = (f"{f.thing} is wrong ({f.line()})" if f.table == "allocations" else
                   f"{f.thing} is quarantined: it gets no new work until the row is "
                   f"fixed ({f.line()})")
        if svc.told.get(key) != message:
            svc.told[key] = message
            log.error("%s", message)
            svc._event(s, "quarantine", message, host=f.host)
    for key in [k for k in svc.told if k[0] == "quarantine" and k not in keys]:
        del svc.told[key]
        host = key[1].split("host=", 1)[1].split(" ", 1)[0]
        svc._event(s, "quarantine", f"{key[1]} is fixed: what it held takes work again",
                   host=host)


def findings(svc) -> list[Finding]:
    """The wrong rows, for the views and /metrics: where this replica leads, those its
    passes hold back (read at each check of the store and every pass while there are
    some: warm.py), so a scrape or a page costs no read of every hold row (seconds on
    thousands of hosts); elsewhere read anew, in a snapshot of its own."""
    w = svc.warm
    if w is not None and w.sched is not None:
        return list(w.found)
    with svc.snapshot() as s:
        return integrity.find(s, svc.cluster)


def listing(found: list[Finding]) -> list[dict]:
    """`found` as the cluster view and /readyz show it."""
    return [{"table": f.table, "host": f.host,
             {"cpu_holds": "cpu", "allocations": "allocation"}.get(f.table, "gpu"): f.index,
             **({"device": f.device} if f.device is not None else {}), "job": f.job,
             "problem": f.problem, "fix": f.fix, "reason": reason(f)} for f in found]


def gpus_by_host(found: list[Finding], cluster: Cluster) -> dict[str, dict[int, str]]:
    """Per host, the GPUs quarantined (whole, or a MIG device of them) and why."""
    out: dict[str, dict[int, str]] = {}
    for f in found:
        host = cluster.by_name.get(f.host)
        if f.table in ("gpu_holds", "mig_holds") and host is not None \
                and 0 <= f.index < host.type.n_gpus:
            out.setdefault(f.host, {}).setdefault(f.index, reason(f))
    return out


def gauge(svc, found: list[Finding]):
    """airflow_gpu_gpus_quarantined per host (every host of the cluster, 0 when none)."""
    from prometheus_client.core import GaugeMetricFamily

    g = GaugeMetricFamily("airflow_gpu_gpus_quarantined", "GPUs that get no new work "
                          "because a wrong hold row holds them or a MIG device of them "
                          "(airflow-gpu db check lists the rows)", labels=["host"])
    by_host = gpus_by_host(found, svc.cluster)
    for h in svc.cluster.hosts:
        g.add_metric([h.name], len(by_host.get(h.name, {})))
    return g


def ready_detail(svc) -> list[dict] | None:
    """For /readyz: the wrong hold rows (what they hold gets no new work, the rest is
    scheduled, so the replica stays ready); None when the database cannot be read (the
    database check of /readyz says why)."""
    try:
        return listing(findings(svc))
    except Exception:           # noqa: BLE001 - /readyz reports the database itself
        return None
