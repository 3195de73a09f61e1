"""Distributed gangs: one Airflow task runs a multi-role job ("2 parameter servers + 10
GPU workers") as one container (or local process) per replica across the admitted hosts,
wired for the job class's framework (TF_CONFIG for tensorflow-ps, torchrun's variables for
pytorch). One replica failing stops the others and fails the task with its exit code."""

from __future__ import annotations

from collections.abc import Sequence

from airflow.sdk import Context, conf

from ..hooks.docker_engine import DEFAULT_PATTERN, DockerEngines, check_pattern
from ..launch.docker import GPU_MODES, SCHEDULER_LABEL, DockerLauncher, reap_orphans
from ..launch.handle import Handle
from ..launch.local import local_host, refuse_other_hosts, start_command
from ..launch.replica import Replica
from ..launch.wiring import BY_CLASS, FRAMEWORKS, wiring
from ..scheduler_core.client import ApiError
from .base import HOLDING, GpuBaseOperator
from .request import split_role

RUNNERS = ("docker", "local")


class GpuGangOperator(GpuBaseOperator):
    """
    :param roles: e.g. ``[{"name": "ps", "replicas": 2, "cpus": 1, "memory": "8GiB"},
        {"name": "worker", "replicas": 10, "gpus": 1, "gpu": {"min_memory": "48GiB"},
        "cpus": 4, "memory": "5GiB", "command": "python train.py"}]``; a role may set its
        own ``image``, ``command`` and ``environment``.
    :param runner: "docker" (containers on each admitted host's Docker engine) or "local"
        (processes on this machine: a single DGX host with LocalExecutor; a replica
        granted on another host than this machine, `[gpu_scheduler] local_host`, fails the
        task before anything starts).
    :param image, command, environment: defaults for every role.
    :param framework: tensorflow-ps | pytorch | none (default: from the job class).
    :param base_port: first rendezvous port on each host (host networking).
    :param gpu_mode: device-request | cdi | env, how containers get their GPUs (default:
        `[gpu_scheduler] docker_gpu_mode`, else device-request).
    :param docker_runtime: container runtime, e.g. "nvidia" with gpu_mode="env" (default:
        `[gpu_scheduler] docker_runtime`).
    :param mounts: "source:target[:ro]" strings or docker Mounts.
    :param docker_url: engine for hosts without a docker_url in the cluster file.
    :param docker_conn_id: the Airflow connection (type docker) of each host's engine: TLS,
        SSH, registry login; `{host}` stands for the host name with other characters than
        letters, digits and `_` as `_` (default: `[gpu_scheduler] docker_conn_id`, else
        `docker_{host}`, which a host may lack; docs/docker-connections.md).
    :param strict_isolation: local runner: fail instead of warning when CPU binding or the
        cgroup cannot be applied as granted.
    """

    template_fields: Sequence[str] = ("roles", "image", "command", "environment",
                                      "expected_runtime", "time_limit", "deadline")

    def __init__(self, *, roles: list[dict] | None = None, runner: str = "docker",
                 image: str | None = None, command: str | list[str] | None = None,
                 environment: dict[str, str] | None = None, framework: str | None = None,
                 base_port: int = 29500, gpu_mode: str | None = None,
                 docker_runtime: str | None = None, network_mode: str = "host",
                 mounts: list | None = None, docker_url: str | None = None,
                 docker_conn_id: str | None = None, cwd: str | None = None,
                 strict_isolation: bool = False, **kwargs) -> None:
        super().__init__(roles=roles, **kwargs)
        gpu_mode = gpu_mode or conf.get("gpu_scheduler", "docker_gpu_mode",
                                        fallback="device-request")
        docker_runtime = docker_runtime or conf.get("gpu_scheduler", "docker_runtime",
                                                    fallback="") or None
        self.docker_conn_id = check_pattern(
            docker_conn_id or conf.get("gpu_scheduler", "docker_conn_id", fallback="")
            or DEFAULT_PATTERN)
        if runner not in RUNNERS:
            raise ValueError(f"runner: {runner!r} is not one of {', '.join(RUNNERS)}")
        if gpu_mode not in GPU_MODES:
            raise ValueError(f"gpu_mode: {gpu_mode!r} is not one of {', '.join(GPU_MODES)}")
        if framework is not None and framework not in FRAMEWORKS:
            raise ValueError(f"framework: {framework!r} is not one of {', '.join(FRAMEWORKS)}")
        self.runner, self.image, self.command = runner, image, command
        self.starts_here = runner == "local"
        self.environment = environment or {}
        self.framework = framework or BY_CLASS.get(self.job_class or "", "none")
        self.base_port, self.gpu_mode, self.docker_runtime = base_port, gpu_mode, docker_runtime
        self.network_mode, self.mounts, self.docker_url = network_mode, mounts or [], docker_url
        self.cwd, self.strict_isolation = cwd, strict_isolation
        for role in self.roles:
            launch = split_role(role)[1]
            if runner == "docker" and not (launch.get("image") or image):
                raise ValueError(f"roles[{role.get('name')}].image: the docker runner needs "
                                 "an image (set image= or the role's image)")
            if runner == "local" and not (launch.get("command") or command):
                raise ValueError(f"roles[{role.get('name')}].command: the local runner "
                                 "needs a command")

    def _launch(self, context: Context, replicas: list[Replica],
                started: list[Handle]) -> None:
        launch = {r["name"]: split_role(r)[1] for r in self.roles}
        ti = context["ti"]
        labels = {"airflow.dag_id": ti.dag_id, "airflow.task_id": ti.task_id,
                  "airflow.run_id": ti.run_id, "airflow.try_number": str(ti.try_number)}
        if self.runner == "docker":
            labels[SCHEDULER_LABEL] = self._reap(replicas)
        else:
            refuse_other_hosts(replicas, local_host(conf.get("gpu_scheduler", "local_host",
                                                             fallback="")))
        for r, wired in zip(replicas, wiring(self.framework, replicas, self.base_port),
                            strict=True):
            role = launch.get(r.role, {})
            env = {**self.environment, **role.get("environment", {}), **wired}
            command = role.get("command") or self.command
            if self.runner == "docker":
                started.append(self._docker(role.get("image"), command, labels).start(r, env))
            else:
                handle, warnings = start_command(r, command, env, self.cwd,
                                                 self.strict_isolation)
                self._warn(r, warnings)
                started.append(handle)
        self.log.info("started %d replica(s) (%s runner, framework %s)", len(started),
                      self.runner, self.framework)

    def _docker(self, image: str | None, command, labels: dict) -> DockerLauncher:
        return DockerLauncher(image=image or self.image, command=command,
                              gpu_mode=self.gpu_mode, runtime=self.docker_runtime,
                              network_mode=self.network_mode, mounts=self.mounts,
                              default_url=self.docker_url, labels=labels,
                              connect=self._engines().client, remove_later=True)

    def _engines(self) -> DockerEngines:
        if getattr(self, "_docker_engines", None) is None:   # one connection lookup per host
            self._docker_engines = DockerEngines(self.docker_conn_id, self.docker_url)
        return self._docker_engines

    def _reap(self, replicas: list[Replica]) -> str:
        """Remove the containers this scheduler's dead jobs left on the replicas' engines;
        returns the scheduler's URL, the label that marks its containers."""
        engines = {}
        for r in replicas:
            engines.setdefault((self._engines().conn_id(r), r.docker_url or self.docker_url), r)
        client = self._scheduler()

        def is_live(job_id: str) -> bool:
            try:
                # a preempting job's containers are saving a checkpoint
                return client.job(job_id)["state"] in HOLDING
            except ApiError as exc:
                return exc.status != 404
        for r in engines.values():   # the engine's client, which its first replica takes
            reap_orphans(self._engines().shared(r), is_live, self.log, client.url)
        return client.url

