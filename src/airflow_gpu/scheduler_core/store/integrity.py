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

from sqlalchemy import delete, select
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


def find(s: Session, cluster=None) -> list[Finding]:
    """The wrong hold rows, in table and key order. With `cluster` (the engine's), holds
    of GPUs, cores or MIG devices its hosts do not have are found too."""
    # The holds first: a pass writes an allocation and its holds in one transaction, and
    # a release deletes the holds as it ends the job, so a hold read here has its
    # allocation and job visible to the reads after it (a row that changed meanwhile is
    # found wrong at worst for one pass; repair deletes only the row as it was found).
    rows = [("gpu_holds", *r, None) for r in s.execute(
        select(GpuHoldRow.host, GpuHoldRow.gpu, GpuHoldRow.job_id)
        .order_by(GpuHoldRow.host, GpuHoldRow.gpu))]
    rows += [("cpu_holds", *r, None) for r in s.execute(
        select(CpuHoldRow.host, CpuHoldRow.cpu, CpuHoldRow.job_id)
        .order_by(CpuHoldRow.host, CpuHoldRow.cpu))]
    rows += [("mig_holds", *r) for r in s.execute(
        select(MigHoldRow.host, MigHoldRow.gpu, MigHoldRow.job_id, MigHoldRow.device)
        .order_by(MigHoldRow.host, MigHoldRow.gpu, MigHoldRow.device))]
    jobs = sorted({r[3] for r in rows})
    states: dict[str, str] = {}
    for i in range(0, len(jobs), 500):       # bounded IN lists
        states.update(s.execute(select(JobRow.id, JobRow.state).where(
            JobRow.id.in_(jobs[i:i + 500]))).all())
    granted: dict[str, set] = {"gpu_holds": set(), "cpu_holds": set(), "mig_holds": set()}
    for job, host, gpus, cpus, mig in s.execute(select(
            AllocationRow.job_id, AllocationRow.host, AllocationRow.gpus, AllocationRow.cpus,
            AllocationRow.mig).where(AllocationRow.live.is_(True))):
        granted["gpu_holds"].update((job, host, g, None) for g in gpus or ())
        granted["cpu_holds"].update((job, host, c, None) for c in cpus or ())
        granted["mig_holds"].update((job, host, m["gpu"], m["index"]) for m in mig or ())
    whole = {(r[1], r[2]): r[3] for r in rows if r[0] == "gpu_holds"}
    out = []
    for table, host, index, job, device in rows:
        problem = _problem(table, host, index, device, job, states.get(job), granted,
                           cluster)
        if problem:
            out.append(Finding(table, host, index, device, job, problem))
        elif table == "mig_holds" and (host, index) in whole:
            other = whole[(host, index)]
            out.append(Finding(table, host, index, device, job,
                               f"GPU {index} is also held whole by job {other}",
                               f"cancel job {job} or job {other} (airflow-gpu cancel ID)"))
    return out


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
