"""Rows that disagree: hold rows against the live allocations, and live allocations
against their jobs and the hosts. `airflow-gpu db check` lists them, `db repair` fixes
what it can (store/repair.py), and each scheduling pass quarantines what a wrong hold row
holds (the GPU, MIG device or core gets no new work: a pass that placed a job there would
fail on the hold table's primary key, and with it every pass after).

`read` takes the rows; `judge`, a pure function of them, decides. The caller reads in
one snapshot (PostgreSQL: REPEATABLE READ; SQLite's read transaction is one): rows read
in separate snapshots disagree whenever a pass commits between two reads.

An allocation is trusted when its job is live and the host has every device it names
(a host the cluster does not know, or no cluster given: its devices are taken as they
are). A hold is right when a trusted allocation of its job names it. A hold is deleted
only when no live allocation of a live job names it and nothing says the job may be
using it: when its job's allocation on that host names devices the host lacks, the
allocation is the wrong row (rewritten from the job's holds); when the allocation names
existing devices that no hold of the job has, which row is right cannot be told, and
neither is changed. An allocation of a job that is not live is marked not live.

The foreign keys make a hold of a job that does not exist impossible while they are
enforced (SQLite with `PRAGMA foreign_keys` off, as the `sqlite3` shell starts, or a
PostgreSQL restore with triggers disabled, let one in)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import AllocationRow, CpuHoldRow, GpuHoldRow, JobRow, MigHoldRow

LIVE = ("admitted", "running", "preempting")      # as service/core.py
REPAIR = "delete it: airflow-gpu db repair"
HOLDS = ("gpu_holds", "cpu_holds", "mig_holds")
ORDER = (*HOLDS, "allocations")


@dataclass(frozen=True)
class Finding:
    """One wrong row: where it is, what is wrong, the fix. `action` is what `db repair`
    does: delete (the hold), later (delete the hold once its allocation is rewritten),
    keep (the hold stays; its allocation is rewritten to name it), retire (mark the
    allocation not live), rewrite (the allocation names `change`); cancel: nothing (which
    row is right cannot be told: cancelling the job frees both); None: nothing, and the
    engine holds what the row holds already."""

    table: str                 # gpu_holds, cpu_holds, mig_holds, allocations
    host: str
    index: int                 # the GPU or the core; allocations: the allocation's id
    device: int | None         # mig_holds: the MIG device of the GPU
    job: str
    problem: str
    fix: str = REPAIR
    action: str | None = "delete"
    change: tuple = ()         # rewrite: (("gpus", (...)), ("cpus", (...)))

    @property
    def key(self) -> str:
        what = {"gpu_holds": "gpu", "cpu_holds": "cpu", "mig_holds": "gpu",
                "allocations": "allocation"}[self.table]
        dev = "" if self.device is None else f" device={self.device}"
        return f"host={self.host} {what}={self.index}{dev}"

    @property
    def repairable(self) -> bool:
        return self.action not in (None, "cancel")

    @property
    def holds(self) -> bool:
        """Whether the row holds something the engine does not know of (quarantine.py)."""
        return self.table != "allocations" and self.action is not None

    @property
    def thing(self) -> str:
        """What the row holds, in words."""
        if self.table == "allocations":
            return f"allocation {self.index} of job {self.job} on host {self.host}"
        if self.table == "cpu_holds":
            return f"core {self.index} of host {self.host}"
        if self.table == "mig_holds":
            return f"MIG device {self.device} of GPU {self.index} of host {self.host}"
        return f"GPU {self.index} of host {self.host}"

    def line(self) -> str:
        return f"{self.table} {self.key} job={self.job}: {self.problem}; fix: {self.fix}"


@dataclass
class Rows:
    """What `judge` decides on, read in one snapshot."""
    held: dict[str, list[tuple]]   # table -> (job, host, index, device) per hold row
    allocs: list[tuple]            # (id, job, host, gpus, cpus, mig) per live allocation
    states: dict[str, str]         # job -> state, for every job named above


def find(s: Session, cluster=None, exact: bool = False,
         hosts: list[str] | None = None) -> list[Finding]:
    """The wrong rows, in table and key order, read with `s` (the caller's snapshot).
    With `cluster` (the engine's), devices its hosts do not have are found too; with
    `hosts`, only the rows of those hosts are read (what `judge` decides on a row depends
    only on its host's rows)."""
    return judge(read(s, cluster, exact, hosts), cluster)


def ordered(found: list[Finding]) -> list[Finding]:
    """`found` in table and key order, as `find` answers."""
    return sorted(found, key=lambda f: (ORDER.index(f.table), f.host, f.index,
                                        f.device or 0, f.job))


def read(s: Session, cluster=None, exact: bool = False,
         hosts: list[str] | None = None) -> Rows:
    """The rows `judge` needs (those of `hosts`, when given). Every pass (and view)
    calls this, so the core holds, the big table, are first read as one fingerprint per
    job and host (count, sum, sum of squares of the cores), and only a job and host whose
    fingerprint differs from its trusted allocations' is read row by row; `exact` (db
    check) reads every row."""
    conn = s.connection()     # Core rows: cheaper than ORM rows

    def on(q, table):
        return q if hosts is None else q.where(table.host.in_(hosts))

    held = {
        "gpu_holds": [(j, h, i, None) for h, i, j in conn.execute(on(
            select(GpuHoldRow.host, GpuHoldRow.gpu, GpuHoldRow.job_id), GpuHoldRow)).all()],
        "cpu_holds": [],
        "mig_holds": [(j, h, i, d) for h, i, d, j in conn.execute(on(
            select(MigHoldRow.host, MigHoldRow.gpu, MigHoldRow.device, MigHoldRow.job_id),
            MigHoldRow)).all()]}
    cpu = CpuHoldRow.cpu
    prints = {} if exact else {(j, h): (n, int(a), int(b)) for j, h, n, a, b in conn.execute(
        on(select(CpuHoldRow.job_id, CpuHoldRow.host, func.count(), func.sum(cpu),
                  func.sum(cpu * cpu)), CpuHoldRow)
        .group_by(CpuHoldRow.job_id, CpuHoldRow.host)).all()}
    allocs = [tuple(r) for r in conn.execute(on(select(
        AllocationRow.id, AllocationRow.job_id, AllocationRow.host, AllocationRow.gpus,
        AllocationRow.cpus, AllocationRow.mig).where(AllocationRow.live.is_(True)),
        AllocationRow)).all()]
    jobs = sorted({r[0] for rows in held.values() for r in rows} | {a[1] for a in allocs}
                  | {j for j, _ in prints})
    states: dict[str, str] = {}
    for i in range(0, len(jobs), 500):       # bounded IN lists
        states.update(conn.execute(select(JobRow.id, JobRow.state).where(
            JobRow.id.in_(jobs[i:i + 500]))).all())
    if exact:
        held["cpu_holds"] = [(j, h, c, None) for h, c, j in conn.execute(on(
            select(CpuHoldRow.host, cpu, CpuHoldRow.job_id), CpuHoldRow)).all()]
        return Rows(held, allocs, states)
    cores: dict[tuple, set[int]] = {}      # (job, host) -> the cores trusted there
    odd = set()                            # (job, host) whose core rows are read
    for _, job, host, gpus, cpus, mig in allocs:
        if states.get(job) not in LIVE:
            continue
        if _lacks(cluster, host, _parts(gpus, cpus, mig)):
            odd.add((job, host))           # its holds may be what it should name
        cores.setdefault((job, host), set()).update(cpus or ())
    odd |= {k for k, fp in prints.items() if fp != _fingerprint(cores.get(k, set()))}
    odd_jobs = sorted({j for j, _ in odd})
    for i in range(0, len(odd_jobs), 500):
        held["cpu_holds"] += [(j, h, c, None) for h, c, j in conn.execute(
            select(CpuHoldRow.host, cpu, CpuHoldRow.job_id).where(
                CpuHoldRow.job_id.in_(odd_jobs[i:i + 500]))).all() if (j, h) in odd]
    return Rows(held, allocs, states)


def _parts(gpus, cpus, mig) -> dict[str, set]:
    """What an allocation names, per hold table, as (index, device) pairs."""
    return {"gpu_holds": {(g, None) for g in gpus or ()},
            "cpu_holds": {(c, None) for c in cpus or ()},
            "mig_holds": {(m["gpu"], m["index"]) for m in mig or ()}}


def _lacks(cluster, host: str, parts: dict[str, set]) -> dict[str, set]:
    """What of `parts` the host does not have (nothing when it is not known)."""
    has = _valid(cluster, host)
    if has is None:
        return {}
    return {t: keys - has[t] for t, keys in parts.items() if keys - has[t]}


def judge(rows: Rows, cluster=None) -> list[Finding]:
    """The wrong rows among `rows` (one consistent read; see the module's docstring)."""
    states, out = rows.states, []
    mine: dict[tuple, dict[str, set]] = {}       # (job, host) -> what its holds hold
    for table, held in rows.held.items():
        for job, host, index, device in held:
            mine.setdefault((job, host), {t: set() for t in HOLDS})[table].add((index, device))
    granted = {t: set() for t in HOLDS}          # named by a trusted allocation
    named = {t: set() for t in HOLDS}            # named by any live allocation of a live job
    missing: dict[tuple, dict[str, set]] = {}    # (job, host) -> named, not held
    wrong = []                                   # live jobs' allocations the host lacks
    for aid, job, host, gpus, cpus, mig in rows.allocs:
        state = states.get(job)
        if state not in LIVE:
            out.append(Finding("allocations", host, aid, None, job,
                               f"{_gone(job, state)}, so it cannot be live",
                               "mark it not live: airflow-gpu db repair", "retire"))
            continue
        parts = _parts(gpus, cpus, mig)
        lacks = _lacks(cluster, host, parts)
        held = mine.get((job, host), {t: set() for t in HOLDS})
        for t, keys in parts.items():
            if t == "cpu_holds" and not held[t]:
                continue    # no core rows here (read only where they differ: `read`)
            named[t].update((job, host, *k) for k in keys)
            if not lacks:
                granted[t].update((job, host, *k) for k in keys)
                if keys - held[t]:
                    missing.setdefault((job, host), {})[t] = keys - held[t]
        if lacks:
            wrong.append((aid, job, host, parts, lacks))
    doubt = {}                                   # (job, host) -> (allocation, rewritten)
    twice = Counter((w[1], w[2]) for w in wrong)
    for aid, job, host, parts, lacks in wrong:
        has = _valid(cluster, host)
        held = mine.get((job, host), {t: set() for t in HOLDS})
        spare = {t: {k for k in held[t] & has[t] - parts[t]
                     if (job, host, *k) not in granted[t]} for t in HOLDS}
        problem = (f"it names {_names(lacks)}, which host {host} "
                   f"({cluster.by_name[host].type.model}) does not have")
        if twice[(job, host)] > 1 or lacks.get("mig_holds") or spare["mig_holds"]:
            doubt[(job, host)] = (aid, False)
            out.append(Finding("allocations", host, aid, None, job, problem,
                               f"cancel job {job} (airflow-gpu cancel {job})", "cancel"))
            continue
        new = {t: sorted(i for i, _ in parts[t] - lacks.get(t, set()) | spare[t])
               for t in ("gpu_holds", "cpu_holds")}
        doubt[(job, host)] = (aid, True)
        out.append(Finding(
            "allocations", host, aid, None, job, problem,
            f"airflow-gpu db repair makes it name GPUs {new['gpu_holds']} and cores "
            f"{new['cpu_holds']} (what the job's hold rows there hold)", "rewrite",
            (("gpus", tuple(new["gpu_holds"])), ("cpus", tuple(new["cpu_holds"])))))
    whole = {(r[1], r[2]): r[0] for r in rows.held["gpu_holds"]}
    for table, held in rows.held.items():
        for job, host, index, device in set(held):
            f = _hold(table, host, index, device, job, states.get(job), cluster,
                      granted, named, doubt, missing)
            if f is not None:
                out.append(f)
            elif table == "mig_holds" and (host, index) in whole:
                other = whole[(host, index)]
                out.append(Finding(table, host, index, device, job,
                                   f"GPU {index} is also held whole by job {other}",
                                   f"cancel job {job} or job {other} (airflow-gpu cancel "
                                   "ID)", None))
    return ordered(out)


def _hold(table: str, host: str, index: int, device: int | None, job: str,
          state: str | None, cluster, granted: dict, named: dict, doubt: dict,
          missing: dict) -> Finding | None:
    """The finding on one hold row; None when it is right."""
    key = (job, host, index, device)
    if state not in LIVE:
        return Finding(table, host, index, device, job, _gone(job, state) if state is None
                       else f"{_gone(job, state)}, so nothing may be held for it")
    if key in granted[table]:
        return None
    lack = _lack(table, host, index, device, cluster)
    if key in named[table]:       # by an allocation the host lacks devices of
        if lack is None:
            return None           # the allocation keeps it when rewritten
        return Finding(table, host, index, device, job, lack, REPAIR, "later")
    if lack is not None:
        return Finding(table, host, index, device, job, lack)
    if (job, host) in doubt:
        aid, rewritten = doubt[(job, host)]
        problem = (f"allocation {aid} of job {job} does not name it: it names devices "
                   f"host {host} does not have")
        if rewritten:
            return Finding(table, host, index, device, job, problem,
                           f"airflow-gpu db repair adds it to allocation {aid}", "keep")
        return Finding(table, host, index, device, job, problem,
                       f"cancel job {job} (airflow-gpu cancel {job})", "cancel")
    instead = missing.get((job, host), {}).get(table)
    if instead:
        return Finding(table, host, index, device, job,
                       f"no live allocation of job {job} holds it, and one names "
                       f"{_names({table: instead})} instead, which no hold row of the job "
                       "holds", f"cancel job {job} (airflow-gpu cancel {job}): which of "
                       "the two rows is right cannot be told", "cancel")
    return Finding(table, host, index, device, job,
                   f"no live allocation of job {job} holds it")


def _gone(job: str, state: str | None) -> str:
    return f"its job {job} does not exist" if state is None else f"its job {job} is {state}"


def _names(parts: dict[str, set]) -> str:
    """Devices in words: GPU 12, core 99, MIG device 3 of GPU 0."""
    words = []
    for t, keys in parts.items():
        for index, device in sorted(keys, key=lambda k: (k[0], k[1] or 0)):
            words.append(f"core {index}" if t == "cpu_holds" else f"GPU {index}"
                         if t == "gpu_holds" else f"MIG device {device} of GPU {index}")
    return ", ".join(words)


def _fingerprint(cores: set[int]) -> tuple[int, int, int]:
    """What the core holds of one job on one host add up to, as SQL sums them."""
    return len(cores), sum(cores), sum(c * c for c in cores)


_HAS: WeakKeyDictionary = WeakKeyDictionary()     # host type -> _valid's answer


def _valid(cluster, host: str) -> dict | None:
    """What the host has, per hold table, as (index, device) pairs; None when `cluster`
    is not known or the host is not in it (the job's lease ends what it holds there)."""
    if cluster is None or host not in cluster.by_name:
        return None
    t = cluster.by_name[host].type
    if t not in _HAS:
        every = 0
        for m in t.numa_cpus:
            every |= m
        _HAS[t] = {"gpu_holds": {(g, None) for g in range(t.n_gpus)},
                   "cpu_holds": {(c, None) for c in range(every.bit_length())
                                 if every >> c & 1},
                   "mig_holds": {(x.gpu, x.index) for x in t.mig.slices}
                   if t.mig else set()}
    return _HAS[t]


def _lack(table: str, host: str, index: int, device: int | None, cluster) -> str | None:
    """Why the host has no such device; None when it has (or is not known)."""
    has = _valid(cluster, host)
    if has is None or (index, device) in has[table]:
        return None
    t = cluster.by_name[host].type
    if table == "cpu_holds":
        return f"host {host} ({t.model}) has no core {index}"
    if not 0 <= index < t.n_gpus:
        return f"host {host} ({t.model}) has {t.n_gpus} GPUs (0-{t.n_gpus - 1})"
    return f"GPU {index} of host {host} has no MIG device {device}"
