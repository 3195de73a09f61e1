"""Replicas as containers on the admitted host's Docker engine (the host's `docker_url`):
the granted GPUs (a device request, CDI names or NVIDIA_VISIBLE_DEVICES), cpuset,
NUMA memory nodes and memory limit from the placement, labels naming job, DAG and task."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest, Mount
from requests.exceptions import RequestException

from ..scheduler_core.engine.topology import format_cpulist
from .handle import LaunchError, signal_of
from .migdevices import cdi_names, toolkit_ids
from .replica import Replica

GPU_MODES = ("device-request", "cdi", "env")
STOP_GRACE = 10        # seconds docker waits between SIGTERM and SIGKILL
SCHEDULER_LABEL = "airflow-gpu.scheduler"   # the URL of the scheduler-core that admitted it


def parse_mount(spec: str | Mount) -> Mount:
    """A docker Mount, or `source:target[:ro]` for a bind mount."""
    if isinstance(spec, Mount):
        return spec
    parts = spec.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"mounts: {spec!r} is not 'source:target' or 'source:target:ro'")
    return Mount(target=parts[1], source=parts[0], type="bind",
                 read_only=len(parts) == 3 and parts[2] == "ro")


def gpu_options(mode: str, gpus: list[int], runtime: str | None,
                mig: list[dict] | None = None) -> dict:
    """The create_container arguments that hand these GPUs (or MIG devices) to the
    container: MIG devices by UUID, or GPU:INDEX where no UUID is known (migdevices.py)."""
    if mode not in GPU_MODES:
        raise ValueError(f"gpu_mode: {mode!r} is not one of {', '.join(GPU_MODES)}")
    if not gpus and not mig:
        return {"runtime": runtime} if runtime else {}
    ids = [str(g) for g in gpus] + toolkit_ids(mig or [])
    if mode == "device-request":
        return {"device_requests": [DeviceRequest(driver="nvidia", device_ids=ids,
                                                  capabilities=[["gpu"]])]}
    if mode == "cdi":
        return {"device_requests": [DeviceRequest(driver="cdi", device_ids=[
            f"nvidia.com/gpu={g}" for g in gpus] + cdi_names(mig or []))]}
    # env: the NVIDIA container runtime (or the engine's default runtime, where the
    # NVIDIA toolkit is configured as default) reads NVIDIA_VISIBLE_DEVICES
    return {"runtime": runtime} if runtime else {}


@dataclass
class DockerLauncher:
    image: str
    command: str | list[str] | None = None
    gpu_mode: str = "device-request"
    runtime: str | None = None             # e.g. "nvidia" for gpu_mode "env"
    network_mode: str = "host"             # rendezvous of distributed jobs uses host ports
    mounts: list[str | Mount] = field(default_factory=list)
    default_url: str | None = None         # engine for hosts without a docker_url
    labels: dict[str, str] = field(default_factory=dict)
    shm_size: str | None = "1g"            # NCCL and data loaders need more than 64 MiB
    # the host's engine through its Airflow connection (hooks/docker_engine.py): TLS, SSH,
    # registry login; None: docker_url / default_url / DOCKER_HOST without credentials
    connect: Callable[[Replica], docker.DockerClient] | None = None
    # the handles' wait() removes the exited container on a thread, which the caller
    # joins with settle() (the Airflow task: while it reports the finish)
    remove_later: bool = False

    def create(self, r: Replica, env: dict[str, str]):
        """The container for a replica, created but not started."""
        client = self.connect(r) if self.connect else engine(r, self.default_url)
        env = {**r.env(), **env}
        if self.gpu_mode == "env" and (r.gpus or r.mig):
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join([*map(str, r.gpus),
                                                      *toolkit_ids(r.mig)])
        elif not r.gpus and not r.mig:
            # CUDA base images set NVIDIA_VISIBLE_DEVICES=all: where the NVIDIA runtime
            # runs the container (the engine's default), a CPU-only replica would get
            # every GPU; "void" gives it none
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        kwargs = dict(
            image=self.image, command=self.command, environment=env,
            name=f"airflow-gpu-{r.job_id[:8]}-{r.name}",
            labels={**self.labels, "airflow-gpu.job": r.job_id, "airflow-gpu.role": r.role,
                    "airflow-gpu.replica": str(r.index), "airflow-gpu.host": r.host},
            cpuset_cpus=format_cpulist(r.cpus) or None,
            cpuset_mems=",".join(map(str, r.numa_nodes)) or None,
            mem_limit=r.memory_bytes, network_mode=self.network_mode,
            mounts=[parse_mount(m) for m in self.mounts], shm_size=self.shm_size,
            detach=True, **gpu_options(self.gpu_mode, r.gpus, self.runtime, r.mig))
        try:
            try:
                return client.containers.create(**kwargs)
            except ImageNotFound:
                client.images.pull(self.image)
                return client.containers.create(**kwargs)
        except NotFound as exc:
            raise LaunchError(f"{r.name}: image {self.image!r} is not on host {r.host}'s "
                              f"Docker engine and cannot be pulled ({exc.explanation}); "
                              "load it on the host, or push it to a registry the host's Docker "
                              "connection logs in to (docs/docker-connections.md)") from None
        except APIError as exc:
            raise LaunchError(f"{r.name}: the Docker engine of host {r.host} refused the "
                              f"container: {exc.explanation or exc}") from None

    def start(self, r: Replica, env: dict[str, str]) -> ContainerHandle:
        container = self.create(r, env)
        try:
            container.start()
        except APIError as exc:
            container.remove(force=True)
            raise LaunchError(self._start_error(r, str(exc.explanation or exc))) from None
        return ContainerHandle(r.name, container, self.remove_later)

    def _start_error(self, r: Replica, why: str) -> str:
        msg = f"{r.name}: the container could not start on host {r.host}: {why}"
        if "could not select device driver" in why:
            msg += (f". The engine has no NVIDIA runtime for the GPU device request (GPUs "
                    f"{r.gpus}): install the NVIDIA Container Toolkit on {r.host}, or set "
                    "gpu_mode='cdi' (CDI specs generated) or gpu_mode='env' with docker_runtime="
                    "'nvidia'")
        return msg



def engine(r: Replica, default_url: str | None = None) -> docker.DockerClient:
    """A client of the replica's host engine (its own: each replica streams its logs)."""
    url = r.docker_url or default_url
    try:
        return docker.DockerClient(base_url=url) if url else docker.from_env()
    except DockerException as exc:
        raise LaunchError(f"{r.name}: cannot reach the Docker engine of host {r.host} "
                          f"at {url or 'DOCKER_HOST / the local socket'} ({exc}); set "
                          "docker_url for the host in the cluster file") from None


def reap_orphans(engine: docker.DockerClient, is_live, log, scheduler: str) -> None:
    """Remove containers of jobs the scheduler at `scheduler` no longer counts as running
    (a worker that died leaves its containers behind; its lease expired and its GPUs went
    to the next job): they must not share those GPUs with the replicas about to start.
    Containers another scheduler-core deployment started on the same engine are its own
    (their jobs are unknown here, not dead), and so are those that name no scheduler (a
    launcher used by hand, an older provider): only what is provably this scheduler's
    goes."""
    # ignore_removed: a container another task removes meanwhile is no longer listed
    for c in engine.containers.list(all=True, filters={"label": "airflow-gpu.job"},
                                    ignore_removed=True):
        job = c.labels["airflow-gpu.job"]
        if c.labels.get(SCHEDULER_LABEL) != scheduler:
            continue
        if not is_live(job):
            log.warning("removing container %s of job %s: the job is no longer running",
                        c.name, job)
            with contextlib.suppress(NotFound, APIError):
                c.remove(force=True)


class ContainerHandle:
    def __init__(self, name: str, container, remove_later: bool = False):
        self.name, self.container = name, container
        self.code: int | None = None     # known once stopped: wait() may find it removed
        self.killed = False              # a stop sent SIGKILL: it outlived the grace
        self.remove_later = remove_later
        self._removal: threading.Thread | None = None

    def lines(self) -> Iterator[str]:
        rest = b""
        for chunk in self.container.logs(stream=True, follow=True):
            rest += chunk
            *done, rest = rest.split(b"\n")
            for line in done:
                yield line.decode(errors="replace")
        if rest:
            yield rest.decode(errors="replace")

    def wait(self) -> int:
        try:
            code = self.container.wait()["StatusCode"]
        except (NotFound, APIError):
            if self.code is None:         # removed by someone else: it did not succeed
                raise
            code = self.code              # stop() removed it after reading its code
        if self.remove_later:
            self._removal = threading.Thread(target=self._remove, daemon=True,
                                             name=f"remove-{self.name}")
            self._removal.start()
        else:
            self._remove()
        return code

    def settle(self) -> None:
        """Wait for the removal wait() left on a thread, if any."""
        if self._removal is not None:
            self._removal.join()

    def stop(self, grace: float | None = None, sig: str | None = None) -> None:
        grace = STOP_GRACE if grace is None else grace
        with contextlib.suppress(NotFound, APIError):   # SIGTERM, then SIGKILL after grace
            # not `docker stop`, which would not say whether it had to SIGKILL
            self._signal(signal_of(sig).name if sig else self._stop_signal(), grace)
            self.code = self.container.wait()["StatusCode"]
        self._remove()

    def _stop_signal(self) -> str:
        """What `docker stop` sends first: the image's STOPSIGNAL, else SIGTERM."""
        return (self.container.attrs.get("Config") or {}).get("StopSignal") or "SIGTERM"

    def _signal(self, sig: str, grace: float) -> None:
        """`sig` to the container's main process, SIGKILL if it still runs after `grace`
        (docker stop would send only its own stop signal)."""
        with contextlib.suppress(APIError):        # it has exited already
            self.container.kill(signal=sig)
        if grace > 0:                               # requests refuses a 0 timeout
            with contextlib.suppress(RequestException):
                self.container.wait(timeout=grace)
                return
        self.killed = True                          # before its exit can be read
        try:
            self.container.kill()
        except APIError:                            # it exited meanwhile
            self.killed = False

    def _remove(self) -> None:
        with contextlib.suppress(NotFound, APIError):
            self.container.remove(force=True)
