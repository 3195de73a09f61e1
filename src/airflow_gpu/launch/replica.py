"""One admitted replica as a launcher sees it, and the environment every replica gets."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..scheduler_core.engine.topology import format_cpulist


@dataclass(frozen=True)
class Replica:
    job_id: str
    role: str
    index: int            # within its role
    rank: int             # within the job (order of the scheduler's allocations)
    host: str
    address: str          # where other replicas reach this host
    docker_url: str | None
    gpus: list[int]       # host-local GPU indices
    cpus: list[int]       # host-local logical CPU ids
    numa_nodes: list[int]
    memory_bytes: int
    nics: list[str]
    attempt: int = 1                   # the job's admission this replica belongs to
    requeue_reason: str | None = None  # why the last admission ended ("preempted", ...)
    # MIG devices instead of whole GPUs: {gpu, index, profile, uuid, label} (migdevices.py)
    mig: list[dict] = field(default_factory=list)
    # an element of a job array (airflow-gpu submit --array): the array's id and its index
    array_id: str | None = None
    array_index: int | None = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def env(self) -> dict[str, str]:
        """What the process needs to know about its grant (NCCL reads NCCL_IB_HCA)."""
        env = {"AIRFLOW_GPU_JOB_ID": self.job_id, "AIRFLOW_GPU_ROLE": self.role,
               "AIRFLOW_GPU_REPLICA": str(self.index), "AIRFLOW_GPU_HOST": self.host,
               "AIRFLOW_GPU_GPUS": ",".join(map(str, self.gpus)),
               "AIRFLOW_GPU_CPUS": format_cpulist(self.cpus),
               "AIRFLOW_GPU_NUMA_NODES": ",".join(map(str, self.numa_nodes)),
               "AIRFLOW_GPU_MEMORY_BYTES": str(self.memory_bytes)}
        if self.nics:
            env["NCCL_IB_HCA"] = ",".join(self.nics)
        if self.mig:
            env["AIRFLOW_GPU_MIG_DEVICES"] = ";".join(m["label"] for m in self.mig)
        # a restarted job (preempted, GPU fault, lost lease) resumes from its checkpoint
        env["AIRFLOW_GPU_ATTEMPT"] = str(self.attempt)
        env["AIRFLOW_GPU_RESTARTED"] = "1" if self.attempt > 1 else "0"
        if self.requeue_reason:
            env["AIRFLOW_GPU_REQUEUE_REASON"] = self.requeue_reason
        if self.array_id is not None:     # Slurm's SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID
            env["AIRFLOW_GPU_ARRAY_ID"] = self.array_id
            env["AIRFLOW_GPU_ARRAY_INDEX"] = str(self.array_index)
        return env

    def describe(self) -> str:
        mig = f", MIG {'; '.join(m['label'] for m in self.mig)}" if self.mig else ""
        return (f"{self.name} on {self.host}: GPUs {self.gpus or '-'}{mig}, CPUs "
                f"{format_cpulist(self.cpus)}, NUMA {self.numa_nodes}, memory "
                f"{self.memory_bytes / 2**30:.1f} GiB, NICs {self.nics or '-'}")


def live_replicas(job: dict) -> list[dict]:
    return [r for r in job["replicas"] if r["live"]]


def needs_cluster(job: dict) -> bool:
    """Whether some live replica lacks its host's addresses (a job read in a list, or
    from a server before they came with it): then the cluster view supplies them."""
    return not all(r.get("address") for r in live_replicas(job))


def replicas_of(job: dict, hosts: dict[str, dict] | None = None) -> list[Replica]:
    """The job's live replicas (API shape), with their hosts' addresses as the job gives
    them, else as the cluster view's `hosts` do."""
    out = []
    for rank, r in enumerate(live_replicas(job)):
        host = r if r.get("address") else (hosts or {}).get(r["host"], {})
        numa = sorted(int(n) for n in r["memory_by_numa"])
        out.append(Replica(job["id"], r["role"], r["index"], rank, r["host"],
                           host.get("address") or r["host"], host.get("docker_url"),
                           list(r["gpus"]), list(r["cpus"]), numa,
                           sum(r["memory_by_numa"].values()), list(r["nics"]),
                           job.get("attempt") or 1, job.get("requeue_reason"),
                           list(r.get("mig") or []), job.get("array_id"),
                           job.get("array_index")))
    return out
