"""Extension points (pluggy, entry-point group `airflow_gpu`).

A plugin module or object implements any of these hooks with `@hookimpl`:

- `airflow_gpu_job_classes()`      -> list[JobClass]: defaults and checks a class applies
- `airflow_gpu_host_filters()`     -> list[HostFilter]: hosts a role may not use
- `airflow_gpu_host_scorers()`     -> list[HostScorer]: preferences among fitting hosts

Filters and scorers follow the Kubernetes scheduling framework's Filter and
Score stages. The built-in job classes are a plugin like any other.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pluggy

if TYPE_CHECKING:
    from .engine.cluster import Host
    from .engine.state import HostState
    from .jobclasses import JobClass
    from .jobspec import JobSpec, Role

PROJECT = "airflow_gpu"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class HostFilter(Protocol):
    def __call__(self, job: JobSpec, role: Role, host: Host) -> str | None:
        """None if `host` may hold replicas of `role`, else the reason it may not."""


class HostScorer(Protocol):
    def __call__(self, job: JobSpec, role: Role, host: Host, state: HostState) -> float:
        """Higher is preferred; scores of all scorers are added."""


class Hooks:
    @hookspec
    def airflow_gpu_job_classes(self) -> list[JobClass]:
        """Job classes this plugin provides."""

    @hookspec
    def airflow_gpu_host_filters(self) -> list[HostFilter]:
        """Placement filters this plugin provides."""

    @hookspec
    def airflow_gpu_host_scorers(self) -> list[HostScorer]:
        """Placement scorers this plugin provides."""


@dataclass
class Registry:
    """What the loaded plugins contribute, flattened once for the engine."""

    job_classes: dict[str, JobClass] = field(default_factory=dict)
    filters: list[HostFilter] = field(default_factory=list)
    scorers: list[HostScorer] = field(default_factory=list)


def make_registry(extra_plugins: tuple = (), entry_points: bool = True) -> Registry:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(Hooks)
    if entry_points:
        pm.load_setuptools_entrypoints(PROJECT)
    from . import jobclasses

    if not pm.is_registered(jobclasses) and not any(
            getattr(p, "__name__", None) == jobclasses.__name__ for p in pm.get_plugins()):
        pm.register(jobclasses)  # running from a source tree without the entry point
    for p in extra_plugins:
        pm.register(p)
    reg = Registry()
    for classes in pm.hook.airflow_gpu_job_classes():
        for jc in classes:
            if jc.name in reg.job_classes:
                raise ValueError(f"job class {jc.name!r} is registered twice")
            reg.job_classes[jc.name] = jc
    reg.filters = [f for fs in pm.hook.airflow_gpu_host_filters() for f in fs]
    reg.scorers = [s for ss in pm.hook.airflow_gpu_host_scorers() for s in ss]
    return reg


@functools.cache
def default_registry() -> Registry:
    return make_registry()
