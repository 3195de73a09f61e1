"""Which host a local-runner task may be admitted on: the host of the worker that runs it.

The local runner starts processes on the worker's own machine, and Airflow chooses the
worker (by the task's queue) before the scheduler-core chooses a host. So the task asks
for its worker's host only (`placement.hosts`): with one Celery queue per DGX host
(`queue="dgx-a-01"`, served by a worker on dgx-a-01) the task runs where it was
admitted, as `srun` runs on the node it was started on. Before anything is submitted,
a worker that is no host of the cluster, or that serves another host's queue, is refused
with the fix."""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowFailException

from ..launch.local import HOST_VARIABLE, SETTING, LocalHost

DOCS = "docs/deployment.md"


def worker_host(here: LocalHost, hosts: list[str], cluster: str, task_id: str,
                queue: str | None) -> str | None:
    """The cluster host this worker is, for the job's `placement.hosts`; None where every
    host is this machine (`local_host = *`, a simulated cluster). Raises
    AirflowFailException (nothing submitted) when this worker cannot run the task."""
    if not here.names:
        return None
    name = next((n for n in here.names if n in hosts), None)
    if name is None:
        shown = ", ".join(hosts[:12]) + (" ..." if len(hosts) > 12 else "")
        example = f"queue='{hosts[0]}'" if hosts else "queue='<host>'"
        raise AirflowFailException(
            f"task {task_id!r} uses the local runner, which starts its replicas on the "
            f"machine of the worker that runs it, and this worker is {here} "
            f"({here.source}), which is no host of the cluster '{cluster}' (its hosts: "
            f"{shown}); the task was on queue {queue!r}. Nothing was submitted. To fix: "
            f"send the task to the queue of a GPU host's worker ({example} on the "
            f"operator; one Celery queue per host, {DOCS}); if this machine is a cluster "
            f"host under another name, set {SETTING} (or {HOST_VARIABLE}) on this worker to "
            "its name in the cluster; or run the replicas as containers "
            "(GpuDockerOperator, GpuGangOperator(runner='docker')), which any worker "
            "can start.")
    if queue and queue in hosts and queue != name:
        raise AirflowFailException(
            f"task {task_id!r} was sent to queue {queue!r}, the queue of host {queue}, but "
            f"the worker that took it is {name!r} ({here.source}). Nothing was submitted. "
            f"To fix: only a worker on {queue} may serve queue {queue!r} (`airflow celery "
            f"worker --queues {queue}` on {queue}, with {HOST_VARIABLE}={queue} or "
            f"{SETTING} = {queue}); remove {queue!r} from the --queues of the worker on "
            f"{name}.")
    return name


def pinned_refusal(host: str, reason: str) -> str:
    """The scheduler refused a local-runner job pinned to this worker's host: say why
    the pin is there and what runs a job that needs more than this host."""
    return (f"the GPU scheduler refused the job: {reason}. The local runner asks only for "
            f"the host of the worker that runs the task ({host}, as placement.hosts): a job "
            "larger than one host needs the Docker runner (GpuGangOperator(runner="
            "'docker')), which starts each replica on its host's Docker engine; a job "
            "another host can hold, the queue of that host's worker")
