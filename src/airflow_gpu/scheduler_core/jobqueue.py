"""Pending jobs, kept in effective-priority order without sorting the queue each pass.

The age term is the same linear function of time for every job, so
`priority + class weight - age_weight * submit_hours` orders a team's jobs for
good. Only the fair-share term moves, and it moves a whole team at once: each
team keeps one sorted list, and a pass merges the lists lazily, adding each
team's current fair-share points.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from .fit import Need
from .jobspec import JobSpec
from .placement import compile_needs


def job_shape(spec: JobSpec) -> tuple:
    """What placement sees of a job: equal shapes fit (or fail) on the same state alike."""
    p = spec.placement
    roles = tuple((r.name, r.replicas, r.gpus, tuple(r.gpu.model or ()), r.gpu.min_memory or 0,
                   r.cpus, r.memory) for r in spec.roles)
    return roles, p.pack, p.locality, p.affinity, p.nics


@dataclass(eq=False)
class QueuedJob:
    spec: JobSpec            # with its job class applied
    submit: float
    seq: int
    runtime: float           # expected runtime, seconds
    base: float              # priority + class weight
    needs: list[Need]
    shape: tuple
    gpus: int = 0            # GPUs of the whole gang

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def team(self) -> str:
        return self.spec.team


class JobQueue:
    def __init__(self, age_weight: float):
        self.age_weight = age_weight
        self._teams: dict[str, list[tuple[float, float, int, QueuedJob]]] = {}
        self.jobs: dict[str, QueuedJob] = {}
        self.shapes: Counter = Counter()
        self.cpu_only = 0                          # queued jobs that ask for no GPU
        self._needs: dict[tuple, list[Need]] = {}   # shared by jobs of one shape

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, name: str) -> bool:
        return name in self.jobs

    def make(self, spec: JobSpec, submit: float, seq: int, runtime: float,
             class_weight: float) -> QueuedJob:
        shape = job_shape(spec)
        needs = self._needs.get(shape)
        if needs is None:
            needs = self._needs[shape] = compile_needs(spec)
        return QueuedJob(spec, submit, seq, runtime, spec.priority + class_weight, needs, shape,
                         spec.total_gpus)

    def static_key(self, job: QueuedJob) -> float:
        """The job's place within its team, smallest first. Keys are rounded to 1e-6 so that
        priorities equal but for float noise tie, and ties go by submit time."""
        return round(self.age_weight * job.submit / 3600.0 - job.base, 6)

    def _entry(self, job: QueuedJob) -> tuple:
        return (self.static_key(job), job.submit, job.seq, job)

    def add(self, job: QueuedJob) -> None:
        if job.name in self.jobs:
            raise ValueError(f"job {job.name!r} is already queued")
        self.jobs[job.name] = job
        self.shapes[job.shape] += 1
        self.cpu_only += not job.gpus
        bisect.insort(self._teams.setdefault(job.team, []), self._entry(job))

    def remove(self, name: str) -> QueuedJob:
        job = self.jobs.pop(name)
        self.shapes[job.shape] -= 1
        self.cpu_only -= not job.gpus
        if not self.shapes[job.shape]:
            del self.shapes[job.shape]
        entries = self._teams[job.team]
        del entries[bisect.bisect_left(entries, self._entry(job)[:3])]
        if not entries:
            del self._teams[job.team]
        return job

    @property
    def teams(self) -> list[str]:
        return list(self._teams)

    def ordered(self, fairshare: dict[str, float]) -> Iterator[QueuedJob]:
        """Jobs by effective priority, highest first; ties by submit time, then arrival.

        Lazy, over a snapshot: remove jobs only after the iteration."""
        def team_iter(team, entries):
            fs = fairshare.get(team, 0.0)
            for key, submit, seq, job in list(entries):
                yield round(key - fs, 6), submit, seq, job

        merged = heapq.merge(*(team_iter(t, e) for t, e in self._teams.items()))
        for *_, job in merged:
            yield job
