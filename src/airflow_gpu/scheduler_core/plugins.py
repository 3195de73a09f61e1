"""Extension points (pluggy, entry-point group `airflow_gpu`).

A plugin module or object implements any of these hooks with `@hookimpl`:

- `airflow_gpu_job_classes()`      -> list[JobClass]: defaults and checks a class applies
- `airflow_gpu_host_filters()`     -> list[HostFilter]: hosts a role may not use
- `airflow_gpu_host_scorers()`     -> list[HostScorer]: preferences among fitting hosts

Filters and scorers follow the Kubernetes scheduling framework's Filter and
Score stages. The built-in job classes (`jobclasses`) and the built-in health scorer
(`healthscore`) are plugins like any other.

A scorer may carry two optional attributes (see HostScorer):

- `applies(state) -> bool`: False when it would score every host alike in this
  cluster state (e.g. the health scorer when no GPU is worn). A placement trial keeps
  only the scorers that apply; with none left, the engine takes the first fitting
  host without scoring (the fast path of a registry without scorers), so a scorer
  that seldom matters costs nothing the rest of the time.
- `max_score: float`: the highest score it ever gives. When every scorer that
  applies has one, a one-host placement looks past the tightest hosts for a host
  that reaches their sum; otherwise it chooses among the tightest hosts that fit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pluggy

from . import healthscore, jobclasses
from .hookmarkers import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:
    from .engine.cluster import Host
    from .engine.state import HostState
    from .jobclasses import JobClass
    from .jobspec import JobSpec, Role

__all__ = ["PROJECT", "hookimpl", "hookspec"]     # plugins mark their hooks with these


class HostFilter(Protocol):
    def __call__(self, job: JobSpec, role: Role, host: Host) -> str | None:
        """None if `host` may hold replicas of `role`, else the reason it may not."""


class HostScorer(Protocol):
    """Scores a host for a replica of `role`. Optional attributes, looked up with
    getattr (plain functions need neither):

    - `applies(state: ClusterState) -> bool`: asked once per placement trial; False
      leaves the scorer out of that trial (as if it scored 0 everywhere).
    - `max_score: float`: the highest score it ever gives (lets a one-host placement
      search past the tightest hosts for a host that reaches it).
    """

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
    for builtin in (jobclasses, healthscore):
        if not pm.is_registered(builtin) and not any(
                getattr(p, "__name__", None) == builtin.__name__ for p in pm.get_plugins()):
            pm.register(builtin)  # running from a source tree without the entry point
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
