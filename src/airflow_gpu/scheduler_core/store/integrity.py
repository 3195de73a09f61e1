"""Hold rows that disagree with the allocations: `airflow-gpu db check` lists them, `db
repair` deletes them, and each scheduling pass quarantines what they hold (the GPU, MIG
device or core gets no new work: a pass that placed a job there would fail on the hold
table's primary key, and with it every pass after).

A hold is right when its job is live and one of the job's live allocations holds the same
GPU, core or MIG device. The foreign keys make a hold of a job that does not exist
impossible while they are enforced (SQLite with `PRAGMA foreign_keys` off, as the
`sqlite3` shell starts, or a PostgreSQL restore with triggers disabled, let one in); a
hold of a job that has ended, or one no live allocation has, the schema allows."""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from .models import AllocationRow, CpuHoldRow, GpuHoldRow, JobRow, MigHoldRow

LIVE = ("admitted", "running", "preempting")      # as service/core.py
REPAIR = "delete it: airflow-gpu db repair"


@dataclass(frozen=True)
class Finding:
    """One hold row that is wrong: where it is, what is wrong, the fix."""

    table: str                 # gpu_holds, cpu_holds, mig_holds
    host: str
    index: int                 # the GPU (gpu_holds, mig_holds) or the core (cpu_holds)
    device: int | None         # mig_holds: the MIG device of the GPU
    job: str
    problem: str
    fix: str = REPAIR

    @property
    def key(self) -> str:
        what = {"gpu_holds": "gpu", "cpu_holds": "cpu", "mig_holds": "gpu"}[self.table]
        dev = "" if self.device is None else f" device={self.device}"
        return f"host={self.host} {what}={self.index}{dev}"

    @property
    def repairable(self) -> bool:
        return self.fix == REPAIR

    @property
    def thing(self) -> str:
        """What the row holds, in words."""
        if self.table == "cpu_holds":
            return f"core {self.index} of host {self.host}"
        if self.table == "mig_holds":
            return f"MIG device {self.device} of GPU {self.index} of host {self.host}"
        return f"GPU {self.index} of host {self.host}"

    def line(self) -> str:
        return f"{self.table} {self.key} job={self.job}: {self.problem}; fix: {self.fix}"


def find(s: Session, cluster=None, exact: bool = False) -> list[Finding]:
    """The wrong hold rows, in table and key order. With `cluster` (the engine's), holds
    of GPUs, cores or MIG devices its hosts do not have are found too.

    Every pass (and view) calls this, so the core holds, the big table, are first read
    as one fingerprint per job and host (count, sum, sum of squares of the cores), and
    only a job and host whose fingerprint differs from its live allocations' is read row
    by row; `exact` (db check) reads every row."""
    conn = s.connection()     # Core rows: cheaper than ORM rows
    # The holds first: a pass writes an allocation and its holds in one transaction, and
    # a release deletes the holds as it ends the job, so a hold read here has its
    # allocation and job visible to the reads after it (a row that changed meanwhile is
    # found wrong at worst for one pass; repair deletes only the row as it was found).
    held = {
        "gpu_holds": [(j, h, i, None) for h, i, j in conn.execute(
            select(GpuHoldRow.host, GpuHoldRow.gpu, GpuHoldRow.job_id)).all()],
        "cpu_holds": [],
        "mig_holds": [(j, h, i, d) for h, i, d, j in conn.execute(
            select(MigHoldRow.host, MigHoldRow.gpu, MigHoldRow.device, MigHoldRow.job_id))
            .all()]}
    cpu = CpuHoldRow.cpu
    prints = {} if exact else {(j, h): (n, int(a), int(b)) for j, h, n, a, b in conn.execute(
        select(CpuHoldRow.job_id, CpuHoldRow.host, func.count(), func.sum(cpu),
               func.sum(cpu * cpu)).group_by(CpuHoldRow.job_id, CpuHoldRow.host)).all()}
    allocs = conn.execute(select(
        AllocationRow.job_id, AllocationRow.host, AllocationRow.gpus, AllocationRow.cpus,
        AllocationRow.mig).where(AllocationRow.live.is_(True))).all()
    jobs = sorted({r[0] for rows in held.values() for r in rows} | {a[0] for a in allocs}
                  | {j for j, _ in prints})
    states: dict[str, str] = {}
    for i in range(0, len(jobs), 500):       # bounded IN lists
        states.update(conn.execute(select(JobRow.id, JobRow.state).where(
            JobRow.id.in_(jobs[i:i + 500]))).all())
    granted: dict[str, set] = {"gpu_holds": set(), "cpu_holds": set(), "mig_holds": set()}
    outside: dict[str, set] = {"gpu_holds": set(), "cpu_holds": set(), "mig_holds": set()}
    cores: dict[tuple, set[int]] = {}      # (job, host) -> the cores granted there
    for job, host, gpus, cpus, mig in allocs:
        if states.get(job) not in LIVE:
            continue
        mine = {"gpu_holds": [(g, None) for g in gpus or ()],
                "mig_holds": [(m["gpu"], m["index"]) for m in mig or ()]}
        has = _valid(cluster, host)
        for table, keys in mine.items():
            granted[table].update((job, host, *k) for k in keys)
            if has is not None:
                outside[table].update((job, host, *k) for k in set(keys) - has[table])
        cores.setdefault((job, host), set()).update(cpus or ())
    lacks = {k: c - has["cpu_holds"] for k, c in cores.items()
             if (has := _valid(cluster, k[1])) is not None}
    if exact:
        held["cpu_holds"] = [(j, h, i, None) for h, i, j in conn.execute(
            select(CpuHoldRow.host, cpu, CpuHoldRow.job_id)).all()]
    else:
        odd = {k for k, fp in prints.items()
               if fp != _fingerprint(cores.get(k, set()) - lacks.get(k, set()))}
        odd_jobs = sorted({j for j, _ in odd})
        for i in range(0, len(odd_jobs), 500):
            held["cpu_holds"] += [(j, h, c, None) for h, c, j in conn.execute(
                select(CpuHoldRow.host, cpu, CpuHoldRow.job_id).where(
                    CpuHoldRow.job_id.in_(odd_jobs[i:i + 500]))).all() if (j, h) in odd]
    for j, h in {r[:2] for r in held["cpu_holds"]}:      # the rows read one by one
        granted["cpu_holds"].update((j, h, c, None) for c in cores.get((j, h), ()))
        outside["cpu_holds"].update((j, h, c, None) for c in lacks.get((j, h), ()))
    whole = {(r[1], r[2]): r[0] for r in held["gpu_holds"]}
    out = []
    for table, rows in held.items():
        keys = set(rows)
        wrong = (keys - granted[table]) | (keys & outside[table])
        for job, host, index, device in wrong:
            problem = _problem(table, host, index, device, job, states.get(job), granted,
                               cluster)
            out.append(Finding(table, host, index, device, job, problem or "?"))
        for job, host, index, device in keys - wrong if table == "mig_holds" else ():
            if (host, index) in whole:
                other = whole[(host, index)]
                out.append(Finding(table, host, index, device, job,
                                   f"GPU {index} is also held whole by job {other}",
                                   f"cancel job {job} or job {other} (airflow-gpu cancel "
                                   "ID)"))
    order = list(held)
    return sorted(out, key=lambda f: (order.index(f.table), f.host, f.index,
                                      f.device or 0, f.job))


def _fingerprint(cores: set[int]) -> tuple[int, int, int]:
    """What the core holds of one job on one host add up to, as SQL sums them."""
    return len(cores), sum(cores), sum(c * c for c in cores)


_HAS: WeakKeyDictionary = WeakKeyDictionary()     # host type -> _valid's answer


def _valid(cluster, host: str) -> dict | None:
    """What the host has: GPUs and MIG devices as (index, device) pairs, cores as
    numbers; None when `cluster` is not known or the host is not in it (the job's lease
    ends what it holds there)."""
    if cluster is None or host not in cluster.by_name:
        return None
    t = cluster.by_name[host].type
    if t not in _HAS:
        every = 0
        for m in t.numa_cpus:
            every |= m
        _HAS[t] = {"gpu_holds": {(g, None) for g in range(t.n_gpus)},
                   "cpu_holds": {c for c in range(every.bit_length()) if every >> c & 1},
                   "mig_holds": {(x.gpu, x.index) for x in t.mig.slices}
                   if t.mig else set()}
    return _HAS[t]


def _problem(table: str, host: str, index: int, device: int | None, job: str,
             state: str | None, granted: dict, cluster) -> str | None:
    if state is None:
        return f"its job {job} does not exist"
    if state not in LIVE:
        return f"its job {job} is {state}, so nothing may be held for it"
    if (job, host, index, device) not in granted[table]:
        return f"no live allocation of job {job} holds it"
    if cluster is None or host not in cluster.by_name:
        return None          # a host gone from the cluster: the job's lease ends it
    t = cluster.by_name[host].type
    if table == "cpu_holds":
        if index < 0 or not any(m >> index & 1 for m in t.numa_cpus):
            return f"host {host} ({t.model}) has no core {index}"
        return None
    if not 0 <= index < t.n_gpus:
        return f"host {host} ({t.model}) has {t.n_gpus} GPUs (0-{t.n_gpus - 1})"
    if table == "mig_holds" and not (t.mig and any(
            x.gpu == index and x.index == device for x in t.mig.slices)):
        return f"GPU {index} of host {host} has no MIG device {device}"
    return None


def repair(s: Session, findings: list[Finding]) -> list[str]:
    """Delete the rows of `findings` that a delete fixes (in the caller's transaction);
    what was done, a line each."""
    done = []
    for f in findings:
        if not f.repairable:
            continue
        if f.table == "gpu_holds":
            q = delete(GpuHoldRow).where(GpuHoldRow.host == f.host, GpuHoldRow.gpu == f.index,
                                         GpuHoldRow.job_id == f.job)
        elif f.table == "cpu_holds":
            q = delete(CpuHoldRow).where(CpuHoldRow.host == f.host, CpuHoldRow.cpu == f.index,
                                         CpuHoldRow.job_id == f.job)
        else:
            q = delete(MigHoldRow).where(MigHoldRow.host == f.host, MigHoldRow.gpu == f.index,
                                         MigHoldRow.device == f.device,
                                         MigHoldRow.job_id == f.job)
        if s.execute(q).rowcount:
            done.append(f"deleted {f.table} {f.key} job={f.job} ({f.problem})")
    return done
