"""Pending jobs in scheduling order, kept without sorting the queue each pass.

The order (docs/queue-policy.md):
1. Business priority band (`priority` + job-class weight), highest first, always.
2. Within a band, the job that became due first once it has waited long enough: the pass
   protects it with a reservation (the wait guarantee). How long grows with the job's
   share of the cluster's GPUs, from `reserve_after` (the smallest jobs) to
   `reserve_after_scale` times that (the whole cluster): a big job's reservation drains
   much of the cluster, so it is made later, once bursts of small work have passed. One
   at a time, by the time each became due, so the protected job never changes until it
   starts.
3. Then the band's jobs whose deadline is near: slack (latest start - now) under
   `deadline_slack`, least slack first, those whose latest start has passed last
   (slack.py; backfill only). A protected job that no pass has promised a start yet
   comes after them.
4. Then the band's other jobs by score = age + fair share + job size (highest first).
5. Behind all of those, the band's jobs the idle-GPU policy requeued (`behind`), by the
   same rules among themselves: their submit is the requeue, so they neither come back
   first by age nor by size onto the GPUs they just left idle (service/idle.py).

The age and size terms of the score are fixed per job (`age_weight * -submit_hours +
size points`), so each (band, team, job shape) keeps one sorted list for good; only the
fair-share term moves, and it moves a whole team at once: a pass merges a band's lists
lazily, adding each team's current fair-share points, and drops a shape's lists once
the pass knows that shape cannot fit.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from collections.abc import Container, Iterator

from ..engine.need import Need
from ..engine.placement import compile_needs
from ..errors import InputError
from ..jobspec import JobSpec
from .quota import spec_need
from .slack import ByLatestStart, urgent
from .types import QueuedJob

# Job size: GPU-minutes of work from 1 (size factor 1) to 10^7 (size factor 0), log scale.
_SIZE_DECADES = 7.0


def job_shape(spec: JobSpec) -> tuple:
    """What placement sees of a job: equal shapes fit (or fail) on the same state alike."""
    p = spec.placement
    roles = tuple((r.name, r.replicas, r.gpus, tuple(r.gpu.model or ()), r.gpu.min_memory or 0,
                   r.cpus, r.booked_memory(),
                   (r.gpu.mig.profile, r.gpu.mig.count) if r.gpu.mig else None)
                  for r in spec.roles)
    return (roles, p.pack, p.locality, p.affinity, p.nics, p.cpu_allocation,
            tuple(p.hosts or ()), spec.reservation)


def size_factor(gpus: int, runtime: float) -> float:
    """1 for the smallest jobs (a GPU-minute or less) down to 0 for 10^7 GPU-minutes:
    Slurm's job-size factor, weighed by expected runtime as well as by GPUs."""
    work = max(1.0, max(gpus, 1) * runtime / 60.0)
    return max(0.0, 1.0 - math.log10(work) / _SIZE_DECADES)


def protect_delay(span: float, charge: float, cluster_gpus: int) -> float:
    """How much later than the smallest job a job is protected: its share of the
    cluster's GPUs x `span` (PolicyConfig.protect_span)."""
    return span * min(1.0, float(charge) / max(1, cluster_gpus))


class NameTaken(InputError, ValueError):
    """A job of that name is queued or running already: an expected conflict (a requeue
    racing the pass), told in one line, not with a traceback (service/health.py)."""


class JobQueue:
    def __init__(self, age_weight: float, size_weight: float = 0.0,
                 protect_span: float = 0.0, cluster_gpus: int = 1):
        self.age_weight, self.size_weight = age_weight, size_weight
        # a job of the whole cluster is protected protect_span seconds after the smallest
        self.protect_span, self.cluster_gpus = protect_span, max(1, cluster_gpus)
        # band -> (account, shape, behind) -> [(static key, submit, seq, job)], and
        # band -> [(due, seq, job)]: when each job became due for protection (protect_due)
        self._bands: dict[float, dict[tuple[str, tuple], list[tuple]]] = {}
        self._by_due: dict[float, list[tuple]] = {}
        self._by_latest: dict[float, ByLatestStart] = {}    # band -> its deadline jobs
        self.jobs: dict[str, QueuedJob] = {}
        self.shapes: Counter = Counter()
        self._runtimes: dict[tuple, list[float]] = {}   # per shape, sorted
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
        charge, cpus, memory = spec_need(spec)
        gpus = spec.total_gpus
        return QueuedJob(spec, submit, seq, runtime, round(spec.priority + class_weight, 6),
                         needs, shape, gpus, charge, size_factor(gpus, runtime), cpus=cpus,
                         memory=memory)

    def static_key(self, job: QueuedJob) -> float:
        """The job's place within its band and team, smallest first. Keys are rounded to
        1e-6 so that scores equal but for float noise tie, and ties go by submit time."""
        return round(self.age_weight * job.submit / 3600.0 - self.size_weight * job.size, 6)

    def terms(self, job: QueuedJob, fairshare: float, now: float) -> dict[str, float]:
        """The job's score as points (Slurm's sprio): its team's fair-share points, the size
        points and the age points, and their sum. Within a band, `ordered` sorts by the
        same sum: `static_key(job) - fairshare` is `age_weight * now / 3600 - score`."""
        size = self.size_weight * job.size
        age = self.age_weight * (now - job.submit) / 3600.0
        return {"fairshare": fairshare, "size": size, "age": age,
                "score": fairshare + size + age}

    def _entry(self, job: QueuedJob) -> tuple:
        return (self.static_key(job), job.submit, job.seq, job)

    def add(self, job: QueuedJob) -> None:
        if job.name in self.jobs:
            raise NameTaken(f"job {job.name!r} is already queued")
        self.jobs[job.name] = job
        self.shapes[job.shape] += 1
        bisect.insort(self._runtimes.setdefault(job.shape, []), job.runtime)
        self.cpu_only += not job.gpus
        lists = self._bands.setdefault(job.base, {})
        bisect.insort(lists.setdefault((job.account, job.shape, job.behind), []),
                      self._entry(job))
        bisect.insort(self._by_due.setdefault(job.base, []), (self.protect_due(job), job.seq,
                                                               job))
        if urgent(job):
            self._by_latest.setdefault(job.base, ByLatestStart()).add(job)

    def remove(self, name: str) -> QueuedJob:
        job = self.jobs.pop(name)
        self.shapes[job.shape] -= 1
        runtimes = self._runtimes[job.shape]
        del runtimes[bisect.bisect_left(runtimes, job.runtime)]
        self.cpu_only -= not job.gpus
        if not self.shapes[job.shape]:
            del self.shapes[job.shape], self._runtimes[job.shape]
        lists = self._bands[job.base]
        entries = lists[job.account, job.shape, job.behind]
        del entries[bisect.bisect_left(entries, self._entry(job)[:3])]
        if not entries:
            del lists[job.account, job.shape, job.behind]
        by_due = self._by_due[job.base]
        del by_due[bisect.bisect_left(by_due, (self.protect_due(job), job.seq))]
        if urgent(job):
            by_latest = self._by_latest[job.base]
            by_latest.remove(job)
            if not by_latest:
                del self._by_latest[job.base]
        if not lists:
            del self._bands[job.base], self._by_due[job.base]
        return job

    def protect_due(self, job: QueuedJob) -> float:
        """The job is protected once `protect_before` (now - reserve_after) reaches this:
        its submit time, later by its share of the cluster's GPUs x protect_span."""
        return job.submit + protect_delay(self.protect_span, job.charge, self.cluster_gpus)

    def shortest(self, shape: tuple) -> float:
        """The shortest expected runtime among the queued jobs of a shape."""
        return self._runtimes[shape][0]

    @property
    def accounts(self) -> list[str]:
        """The fair-share accounts (teams, teams' users) of the queued jobs."""
        return list({a for lists in self._bands.values() for a, *_ in lists})

    def protected(self, protect_before: float) -> int:
        """How many queued jobs are protected (see `ordered`): one per band at most."""
        return sum(min(1, bisect.bisect_right(e, (protect_before, math.inf)))
                   for e in self._by_due.values())

    def urgent(self, urgent_before: float) -> int:
        """How many queued jobs have a latest start before `urgent_before` (slack.py)."""
        return sum(b.count_before(urgent_before) for b in self._by_latest.values()) \
            if urgent_before > -math.inf else 0

    def ordered(self, fairshare: dict[str, float], protect_before: float = -math.inf,
                skip_shapes: set | None = None, urgent_before: float = -math.inf,
                promised: Container[str] = (), now: float = -math.inf
                ) -> Iterator[tuple[QueuedJob, bool]]:
        """(job, protected) in scheduling order: in each band, the job that became due
        for protection first if that was at or before `protect_before`, then the jobs
        whose latest start is before `urgent_before` (earliest first; those whose latest
        start is before `now` after the others, slack.py), then the others by score.
        A protected job not yet `promised` a start comes after the urgent jobs: they
        reserve first and its promise is made behind them; once made, a promise stands
        and the protected job goes first.

        Lazy: remove jobs only after the iteration. Shapes that enter `skip_shapes`
        meanwhile yield no more jobs (the band's other jobs keep their order)."""
        for band in sorted(self._bands, reverse=True):
            by_due = self._by_due[band]
            first = by_due[:min(1, bisect.bisect_right(by_due, (protect_before, math.inf)))]
            protected = [(job, True) for *_, job in first]
            promised_first = bool(first) and first[0][2].name in promised
            if promised_first or len(first) == len(by_due):
                yield from protected
            if len(first) == len(by_due):
                continue
            skip = {seq for _, seq, _ in first}
            by_latest = self._by_latest.get(band)
            for _, seq, job in by_latest.before(urgent_before, now) if by_latest else ():
                if seq not in skip:        # tried whatever its shape: it may get a reservation
                    skip.add(seq)
                    yield job, False
            if not promised_first:
                yield from protected
            # a k-way merge of the (account, shape, behind) lists, each offset by its
            # account's fair share; the lists of jobs requeued as idle after all others
            lists = [(entries, fairshare.get(acct, 0.0), shape, behind)
                     for (acct, shape, behind), entries in self._bands[band].items()]
            heap = [(behind, round(e[0][0] - fs, 6), e[0][1], e[0][2], i, 0)
                    for i, (e, fs, _, behind) in enumerate(lists)]
            heapq.heapify(heap)
            while heap:
                _, _, _, seq, i, k = heap[0]
                entries, fs, shape, behind = lists[i]
                if skip_shapes is not None and shape in skip_shapes:
                    heapq.heappop(heap)
                    continue            # the rest of this list is skipped too
                if seq not in skip:
                    yield entries[k][3], False
                if k + 1 < len(entries):     # its list's next takes its place: one sift
                    key, submit, nseq, _ = entries[k + 1]
                    heapq.heapreplace(heap, (behind, round(key - fs, 6), submit, nseq, i,
                                             k + 1))
                else:
                    heapq.heappop(heap)
