"""A file of admins' reservations for `simulate` and `plan` (`--reservations FILE`), so an
admin can see what a window costs in waits before making it. Times are durations from
the start of the trace (or of `plan`'s pass):

    reservations:
      - {name: firmware, hosts: "dgx-a-[01-16]", start: 4h, duration: 4h, maint: true}
      - {name: demo, gpus: 16, gpu_model: H100, start: 1d, end: 1d6h, teams: [vision]}
"""

from __future__ import annotations

from pydantic import Field, model_validator

from ..engine.cluster import Cluster
from ..errors import InputError, load_yaml, validate
from ..jobspec import _NAME, HostNames, _Spec
from ..policy.windows import Window, choose_hosts
from ..units import Duration


class WindowEntry(_Spec):
    name: str = Field(pattern=_NAME, max_length=200)
    hosts: HostNames | None = Field(None, description="host names or ranges (or gpus)")
    gpus: int | None = Field(None, ge=1, description="this many GPUs, as whole hosts")
    gpu_model: str | None = Field(None, max_length=200)
    start: Duration = Field(0, ge=0, description="from the start of the trace")
    end: Duration | None = Field(None, gt=0)
    duration: Duration | None = Field(None, gt=0)
    teams: list[str] = []
    maint: bool = False

    @model_validator(mode="after")
    def _one_of_each(self) -> WindowEntry:
        if (self.hosts is None) == (self.gpus is None):
            raise ValueError("give hosts or gpus, one of them")
        if (self.end is None) == (self.duration is None):
            raise ValueError("give end or duration, one of them")
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end: {self.end} s is not after start {self.start} s")
        if self.maint == bool(self.teams):
            raise ValueError("a reservation is either maint: true or for teams: [...]")
        return self


class WindowFile(_Spec):
    reservations: list[WindowEntry]


def load_windows(path: str, cluster: Cluster) -> list[Window]:
    """The file's reservations on `cluster`; errors name the file, the entry and the fix."""
    entries = validate(WindowFile, load_yaml(path), path).reservations
    out: list[Window] = []
    for i, e in enumerate(entries):
        where = f"reservations[{i}] ({e.name})"
        end = e.end if e.end is not None else e.start + e.duration
        overlapping = [w for w in out if w.start < end and w.end > e.start]
        if e.hosts is not None:
            hosts = list(e.hosts)
            unknown = [h for h in hosts if h not in cluster.by_name]
            if unknown:
                raise InputError(f"{where}.hosts: {unknown[0]!r} is not a host of cluster "
                                 f"{cluster.name!r}", path)
        else:
            try:
                hosts = choose_hosts(cluster, e.gpus, e.gpu_model,
                                     {h for w in overlapping for h in w.hosts})
            except ValueError as exc:
                raise InputError(f"{where}.gpus: {exc}", path) from None
        for w in overlapping:
            both = sorted(set(hosts) & set(w.hosts))
            if both:
                raise InputError(f"{where}: {both[0]} is in reservation {w.name!r} at the "
                                 "same time; choose other hosts or another time", path)
        if any(w.name == e.name for w in out):
            raise InputError(f"{where}.name: {e.name!r} appears twice", path)
        out.append(Window(e.name, tuple(hosts), float(e.start), float(end),
                          frozenset(e.teams), e.maint))
    return out
