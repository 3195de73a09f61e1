"""What every GPU operator shares: the job spec from the operator's arguments, submit with
an idempotency key, deferral until admission, the lease heartbeat, finish and on_kill.
Subclasses only say how replicas start (containers, processes, a Python callable)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import BaseOperator, Context, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ..hooks.scheduler import GpuSchedulerHook, client_options
from ..launch.handle import Handle, LaunchError
from ..launch.lease import Lease, beat_interval, monotonic_at
from ..launch.local import local_host
from ..launch.replica import Replica, needs_cluster, replicas_of
from ..launch.supervise import Outcome, settle, stop_all, supervise
from ..scheduler_core.client import ApiError, Client
from ..scheduler_core.errors import InputError
from ..scheduler_core.jobclasses import timeout_message
from ..scheduler_core.jobfile import job_request
from ..triggers.admission import AdmissionTrigger
from .background import Background
from .deadlines import Downstream, add_deadline, check_deadline, due_of, estimate
from .links import GpuJobLink
from .request import idempotency_key, job_name, runtime_from_history, split_role, task_user
from .routing import pinned_refusal, worker_host

LIVE = ("admitted", "running")
HOLDING = (*LIVE, "preempting")   # states whose replicas may still run (stopping)


class GpuBaseOperator(BaseOperator):
    """Base of the GPU operators. The task asks for resources, never for a host or GPU.

    :param gpus: GPUs per replica. :param gpu_model: accepted GPU models (substrings of
    the GPU name, e.g. "A100"). :param gpu_memory: minimum memory per GPU ("48GiB").
    :param mig: MIG devices instead of whole GPUs: a profile ("1g.10gb") or
        {"profile": "3g.40gb", "count": 2} (the job spec's `gpu.mig`).
    :param cpus: logical CPUs per replica. :param memory: host memory per replica (booked
    and its limit; default: per GPU and per CPU, from the job class or the queue policy).
    :param job_class: e.g. pytorch, tensorflow-ps, etl, validation.
    :param time_limit: hard limit (Slurm's --time), e.g. "12h": at it the replicas get
        SIGTERM, then SIGKILL after the job class's grace, and the task fails naming it;
        default: the job class's, else the queue policy's.
    :param priority: higher runs first. :param expected_runtime: e.g. "2h"; default: the
    median of the task's last successful runs where the class allows, else the class's.
    :param team: default: the connection's `team` extra, else the token's team.
    :param placement: e.g. {"locality": "switch", "affinity": "strict"}.
    :param admission_timeout: seconds to wait for admission before failing (default: none);
        at it the job is cancelled and the task fails naming the pending reason, in every
        runner (`airflow dags test` included).
    :param admission_grace: seconds to wait in the worker before deferring (a free cluster
        admits within a scheduling pass).
    :param reservation: run only inside this admin's reservation for the task's team
        (`airflow-gpu reserve list`), like Slurm's --reservation.
    :param user: who in the team the job is for (fair share within the team, `acct --by
        user`); default: the user who triggered the DAG run, else the task's owner unless
        it is Airflow's default owner.
    :param notify: a webhook the scheduler POSTs the job's events to, signed with the
        team's secret: a URL (events end and failure), or {"url": ..., "events": [start,
        end, failure, preemption, requeue, idle, reservation, deadline]} (the job spec's `notify`;
        docs/notifications.md). The task log shows those of preemption, requeue and idle.
    :param deadline: when the DAG run must be done, if earlier than the DAG's DeadlineAlerts
        say: an aware datetime or ISO string, or a duration after the run was queued ("2h",
        a timedelta); sent with the GPU work still to run after this task (docs/airflow.md,
        "Deadlines").
    """

    template_fields: Sequence[str] = ("expected_runtime", "time_limit", "deadline")
    gpu_task = True     # counts on another task's downstream path (deadlines.gpu_fields)
    ui_color = "#76b900"
    starts_here = False     # the local runner: replicas start on the worker's machine
    operator_extra_links = (GpuJobLink(),)

    def __init__(self, *, gpus: int = 0, gpu_model: str | list[str] | None = None,
                 gpu_memory: str | int | None = None, cpus: int = 1,
                 memory: str | int | None = None, job_class: str | None = None,
                 priority: int = 0,
                 expected_runtime: str | int | None = None,
                 time_limit: str | int | None = None, team: str | None = None,
                 placement: dict[str, Any] | None = None,
                 gpu_scheduler_conn_id: str = GpuSchedulerHook.default_conn_name,
                 poll_interval: float = 5.0, admission_timeout: float | None = None,
                 admission_grace: float = 1.0, roles: list[dict] | None = None,
                 mig: str | dict | None = None, reservation: str | None = None,
                 user: str | None = None, notify: str | dict | None = None,
                 deadline: datetime | timedelta | str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        gpu = {k: v for k, v in (("model", gpu_model), ("min_memory", gpu_memory),
                                 ("mig", mig)) if v}
        self.roles = roles or [{"name": "main", "gpus": gpus, "cpus": cpus,
                                **({"memory": memory} if memory is not None else {}),
                                **({"gpu": gpu} if gpu else {})}]
        self.job_class, self.priority, self.team = job_class, priority, team
        self.expected_runtime, self.placement = expected_runtime, placement or {}
        self.time_limit, self.reservation, self.user = time_limit, reservation, user
        self.gpu_scheduler_conn_id = gpu_scheduler_conn_id
        self.poll_interval, self.admission_timeout = poll_interval, admission_timeout
        self.admission_grace = admission_grace
        self.notify = {"url": notify} if isinstance(notify, str) else notify
        check_deadline(deadline)
        self.deadline = deadline
        self._spec("check")            # a DAG with a bad request fails when it is parsed
        self._job_id: str | None = None
        self._deferred = False         # raised TaskDeferred: a trigger now waits in-process
        self._handles: list[Handle] = []
        self._stop = threading.Event()
        self._lease = Lease()          # heartbeats: what was logged once (preemption, idle)
        self._client: Client | None = None    # the task's scheduler client (_scheduler)
        self._connection = None
        self._cluster_view: dict | None = None

    # -- the job spec ---------------------------------------------------------------------
    def _spec(self, name: str, team: str | None = None,
              runtime: str | int | None = None, host: str | None = None,
              user: str | None = None) -> dict:
        spec: dict[str, Any] = {"name": name, "priority": self.priority,
                                "roles": [split_role(r)[0] for r in self.roles]}
        if user or self.user:
            spec["user"] = self.user or user
        placement = {**self.placement, "hosts": [host]} if host else self.placement
        for key, value in (("team", team or self.team), ("job_class", self.job_class),
                           ("expected_runtime", runtime or self.expected_runtime),
                           ("time_limit", self.time_limit),
                           ("placement", placement), ("reservation", self.reservation),
                           ("notify", self.notify)):
            if value:
                spec[key] = value
        try:    # as job files are checked and sent (jobfile.py), in the same words
            return job_request(spec, f"task {self.task_id!r}: the GPU request is invalid")
        except InputError as exc:
            raise ValueError(str(exc)) from None

    def _runtime(self, client, name: str) -> int | None:
        """Median of the last successful runs, where the job class allows it."""
        if self.expected_runtime:
            return None
        return runtime_from_history(client, name, self.job_class, self.time_limit, self.log)

    # -- submit and wait ------------------------------------------------------------------
    @property
    def hook(self) -> GpuSchedulerHook:
        return GpuSchedulerHook(self.gpu_scheduler_conn_id)

    def _scheduler(self) -> Client:
        """The task's one scheduler client: the connection is looked up once (in Airflow 3
        a call to the API server), one HTTP connection is kept for every call."""
        if self._client is None:
            self._connection = self.hook.get_connection(self.gpu_scheduler_conn_id)
            self._client = Client(**client_options(self._connection))
        return self._client

    def _cluster(self, client) -> dict:
        """The cluster's hosts, read once per task (the local runner needs them twice)."""
        if self._cluster_view is None:
            self._cluster_view = client.cluster()
        return self._cluster_view

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def execute(self, context: Context) -> Any:
        try:
            return self._submit(context)
        finally:
            self._close()

    def _submit(self, context: Context) -> Any:
        ti = context["ti"]
        name = job_name(ti.dag_id, ti.task_id)
        client = self._scheduler()
        team = self.team or self._connection.extra_dejson.get("team")
        due = due_of(self, context, self.log)     # no call to anything without a deadline
        later = Downstream(self, client, ti.dag_id, self.log) if due else None
        runtime, host = self._runtime_and_host(client, name)
        spec = self._spec(name, team, runtime, host, task_user(context))
        if due:
            spec = add_deadline(spec, due, later.result(), estimate(spec, None, name),
                                self.log)
        try:
            job = client.submit(spec, idempotency_key(ti))
        except ApiError as exc:
            if exc.status == 422:
                raise AirflowFailException(pinned_refusal(host, str(exc)) if host else
                                           f"the GPU scheduler refused the job: "
                                           f"{exc}") from None
            raise AirflowException(f"submitting the GPU job failed: {exc}") from None
        self._job_id = job["id"]            # on_kill cancels it from here on
        # the XCom goes while the scheduler admits the job and confirms its start
        pushed = Background(ti.xcom_push, key="gpu_job_id", value=job["id"])
        self.log.info("GPU job %s submitted (%s)", job["id"][:8], job["state"])
        since = time.time()
        try:
            job = self._grace(client, job)
            if job["state"] in LIVE:
                job = self._start(client, job["id"])
        finally:
            pushed.wait()        # before any other call to Airflow (dag.test's are serial)
        if pushed.error is not None:
            if job["state"] in LIVE:
                self._finish(client, job["id"], job["attempt"], "failed", None)
            raise pushed.error
        if job["state"] in LIVE:
            return self._run(context, job)
        if job["state"] != "pending":
            raise AirflowException(f"GPU job {job['id'][:8]} is already {job['state']}")
        self._defer(job, since)

    def _runtime_and_host(self, client, name: str) -> tuple[int | None, str | None]:
        """The expected runtime from history, and for the local runner (it starts processes
        here) the host of the worker that runs the task, None for any host (the Docker
        runner, `local_host = *`); with both, their reads overlap."""
        here = (local_host(conf.get("gpu_scheduler", "local_host", fallback=""))
                if self.starts_here else None)
        if here is None or not here.names:
            return self._runtime(client, name), None
        runtime = Background(self._runtime, client, name)
        try:
            cluster = self._cluster(client)
            host = worker_host(here, [h["name"] for h in cluster["hosts"]],
                               cluster.get("cluster", "?"), self.task_id, self.queue)
        finally:
            runtime.wait()
        return runtime.result(), host

    def _grace(self, client, job: dict) -> dict:
        """On a cluster with room the next pass admits within a moment: wait that long
        here (one long poll, answered as the pass commits) rather than pay a round trip
        through the triggerer."""
        deadline = time.monotonic() + self.admission_grace
        while job["state"] == "pending" and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            job = client.wait(job["id"], "pending", min(left, 60))
        if self._stop.is_set():                 # on_kill: the job is cancelled
            raise AirflowException(f"GPU job {job['id'][:8]}: the task was stopped while "
                                   "waiting for admission; the job is cancelled")
        return job

    def _defer(self, job: dict, since: float | None = None) -> None:
        """The trigger enforces admission_timeout itself (no defer(timeout=)): only the
        Airflow scheduler applies that, and it would leave the job queued."""
        why = job.get("pending") or {}
        self.log.info("waiting for GPUs without a worker slot (deferred): %s",
                      why.get("reason") or "queued")
        timeout = self.admission_timeout
        deadline = (since or time.time()) + timeout if timeout is not None else None
        self._deferred = True
        self.defer(trigger=AdmissionTrigger(job["id"], self.gpu_scheduler_conn_id,
                                            self.poll_interval, deadline, timeout),
                   method_name="execute_admitted")

    def execute_admitted(self, context: Context, event: dict[str, Any]) -> Any:
        self._deferred = False
        if event["status"] != "admitted":
            raise AirflowException(f"GPU job {event['job_id'][:8]}: {event['message']}")
        self.log.info("GPU job %s %s", event["job_id"][:8], event["message"])
        try:
            return self._run(context, self._start(self._scheduler(), event["job_id"]))
        finally:
            self._close()

    # -- run ------------------------------------------------------------------------------
    def _start(self, client, job_id: str) -> dict:
        """Confirm the start of the admitted job (its first heartbeat); the job as it is."""
        self._job_id = job_id
        try:
            return client.heartbeat(job_id)
        except ApiError as exc:
            raise AirflowException(f"GPU job {job_id[:8]} cannot start: {exc}") from None

    def _run(self, context: Context, job: dict) -> Any:
        job_id = job["id"]
        client = self._scheduler()
        attempt = job["attempt"]             # the admission these replicas belong to
        hosts = ({h["name"]: h for h in self._cluster(client)["hosts"]}
                 if needs_cluster(job) else None)
        replicas = replicas_of(job, hosts)
        for r in replicas:
            self.log.info("granted %s", r.describe())
        try:
            self._handles = []
            self._launch(context, replicas, self._handles)
        except LaunchError as exc:
            stop_all(self._handles)
            self._finish(client, job_id, attempt, "failed", None)
            raise AirflowException(str(exc)) from None
        outcome = supervise(self._handles, self.log,
                            lambda: self._beat(client, job_id, attempt),
                            self._beat_interval(job), self._stop,
                            monotonic_at(job.get("deadline_at")),
                            float(job.get("stop_grace") or 0))
        try:            # the finish is reported while exited containers are removed
            if outcome.timed_out:
                self._finish(client, job_id, attempt, "timeout", None)
                raise AirflowException(f"GPU job {job_id[:8]}: " + timeout_message(
                    job["time_limit_s"], job.get("stop_grace") or 0, outcome.ended()))
            return self._conclude(client, job_id, attempt, replicas, outcome)
        finally:
            settle(self._handles)

    def _conclude(self, client, job_id: str, attempt: int, replicas: list[Replica],
                  outcome: Outcome) -> Any:
        if outcome.ok:
            self._finish(client, job_id, attempt, "succeeded", 0)
            return self._result(replicas)
        why = outcome.interrupted
        if why is not None and why.state == "preempting":
            self.log.warning("GPU job %s: the replicas stopped after the preemption (exit "
                             "codes %s); waiting for a new placement under the same id",
                             job_id[:8], outcome.codes or "-")
            self._finish(client, job_id, attempt, "preempted", None)
            self._lease.notified(client, job_id, ("requeue",), self.log)
            self._defer(client.job(job_id))
        if why is not None and why.state == "pending":
            self.log.warning("the scheduler requeued the job (%s): waiting for a new "
                             "placement", why)
            self._lease.notified(client, job_id, ("requeue",), self.log)
            self._defer(client.job(job_id))
        if why is not None:
            raise AirflowException(f"GPU job {job_id[:8]}: {why}")
        self._finish(client, job_id, attempt, "failed", outcome.exit_code)
        tail = "\n".join(f"  [{outcome.failed}] {line}" for line in outcome.tail)
        raise AirflowException(f"replica {outcome.failed} exited with code "
                               f"{outcome.exit_code}; its last lines:\n{tail}")

    def _result(self, replicas: list[Replica]) -> Any:
        return {"job_id": self._job_id,
                "replicas": [{"role": r.role, "index": r.index, "host": r.host,
                              "gpus": r.gpus, "cpus": r.cpus, "numa_nodes": r.numa_nodes,
                              "nics": r.nics, **({"mig": r.mig} if r.mig else {})}
                             for r in replicas]}

    @staticmethod
    def _beat_interval(job: dict) -> float:
        return beat_interval(job)

    def _beat(self, client, job_id: str, attempt: int) -> None:
        self._lease.beat(client, job_id, attempt, self.log)

    def _finish(self, client, job_id: str, attempt: int, outcome: str,
                code: int | None) -> None:
        try:
            client.finish(job_id, outcome, code, attempt)
        except (ApiError, InputError) as exc:
            self.log.warning("could not report the end of GPU job %s: %s", job_id[:8], exc)

    def _launch(self, context: Context, replicas: list[Replica],
                started: list[Handle]) -> None:
        """Start every replica, appending each handle to `started` as it starts."""
        raise NotImplementedError

    def _warn(self, replica: Replica, warnings: list[str]) -> None:
        for w in warnings:
            self.log.warning("%s: %s", replica.name, w)

    def on_kill(self) -> None:
        """The task is killed: stop the replicas and release the GPUs now.

        After TaskDeferred a worker process ends, so a call while `_deferred` means the
        trigger runs inline in this process (`airflow dags test`, `dag.test()`), whose
        SIGTERM handler lands here: cancel the job and end the run, as SIGTERM would."""
        self._stop.set()
        stop_all(self._handles)
        if self._job_id:
            with self.hook.get_conn() as client:
                try:
                    client.cancel(self._job_id)
                except (ApiError, InputError) as exc:
                    self.log.warning("could not cancel GPU job %s: %s", self._job_id[:8], exc)
                else:
                    self.log.info("cancelled GPU job %s", self._job_id[:8])
        if self._deferred:
            raise SystemExit(f"stopped while GPU job {self._job_id[:8]} waited for admission "
                             "(SIGTERM); the job is cancelled")
