"""Reservations an admin makes (Slurm's `scontrol create reservation`, Grid Engine's
`qrsub`): whole hosts held for a window of time, for maintenance or for some teams.

To the pass a window is a hold in time, as a protected job's reservation is: a job that
may not use it starts on its hosts only if it is expected to end before the window
starts (and yields then if it overruns), protected jobs plan around it, and after its end
the hosts are free again. A job that asks for a team window (`reservation: NAME`, of one
of its teams) starts only inside it, on its hosts, between its start and its end, and is
stopped at its end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..engine.migfit import HOLDERS_KEPT
from ..engine.state import ReplicaAllocation
from ..jobspec import JobSpec, Placement
from ..units import format_duration
from .reservations import Reservation
from .types import Pending, QueuedJob

PREFIX = "reservation "     # the name a window's hold goes by (no job name has a space)


@dataclass(frozen=True)
class Window:
    name: str
    hosts: tuple[str, ...]
    start: float
    end: float
    teams: frozenset[str] = frozenset()     # who may ask for it (none: maintenance)
    maint: bool = False

    @property
    def kind(self) -> str:
        return "maintenance reservation" if self.maint else "reservation"

    def admits(self, job: QueuedJob) -> bool:
        """The job asks for this window and may use it."""
        return (not self.maint and job.spec.reservation == self.name
                and job.team in self.teams)

    def describe(self, now: float) -> str:
        if self.start <= now:
            when = f"until {format_duration(self.end - now)} from now"
        else:
            when = (f"from {format_duration(self.start - now)} from now for "
                    f"{format_duration(self.end - self.start)}")
        return f"{self.kind} {self.name!r} on {', '.join(self.hosts)} {when}"


class WindowHold(Reservation):
    """A window as the pass holds it: the whole of its hosts, from its start to its end."""
    window: Window
    frees_hosts = True


def window_of(name: str) -> str | None:
    """The window a hold's job name stands for (PassResult.cut), else None."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else None


def hold(w: Window, state) -> WindowHold:
    """The hold of `w` on `state`'s cluster: every GPU, core, MIG device and byte of its
    hosts (hosts the cluster no longer has are left out)."""
    allocs = []
    for name in w.hosts:
        h = state.cluster.by_name.get(name)
        if h is None:
            continue
        t = h.type
        allocs.append(ReplicaAllocation(
            PREFIX + w.name, "hold", 0, h, t.all_gpus,
            [(p, m) for p, m in enumerate(t.numa_cpus) if m],
            [(p, b) for p, b in enumerate(t.numa_mem) if b],
            slice_mask=t.mig.all if t.mig is not None else 0))
    spec = JobSpec.model_construct(name=PREFIX + w.name, team="", priority=0, roles=[],
                                   placement=Placement(), reservation=None)
    job = QueuedJob(spec, w.start, -1, w.end - w.start, math.inf, [], ("window", w.name))
    r = WindowHold(job, w.start, w.end, allocs, protected=True)
    r.window = w
    return r


def confined(spec: JobSpec, w: Window) -> JobSpec:
    """The job's spec limited to the window's hosts (and to its own hosts, if it names
    any)."""
    mine = spec.placement.hosts
    hosts = [h for h in w.hosts if mine is None or h in mine]
    return spec.model_copy(update={"placement": spec.placement.model_copy(
        update={"hosts": hosts or list(w.hosts)})})


def waiting_for(w: Window | None, job: QueuedJob, now: float) -> Pending | None:
    """Why a job that asks for a window cannot start in it at all now, or None."""
    name = job.spec.reservation
    if w is None:
        return Pending("Reservation", f"asks for reservation {name!r}, which does not "
                       "exist (or has ended)", {"reservation": name})
    details = {"reservation": w.name, "window_start": w.start, "window_end": w.end,
               "reservation_hosts": list(w.hosts)}
    if w.maint or job.team not in w.teams:
        return Pending("Reservation", f"asks for {w.kind} {w.name!r}, which is not "
                       f"for team {job.team!r}", details)
    if now < w.start:
        return Pending("Reservation", f"waits for its {w.describe(now)}", details,
                       eta=w.start - now)
    return None


def blocked_by(w: Window, job: QueuedJob, runtime: float, now: float) -> Pending:
    """A job that fits now only on a window's hosts, which it may not use."""
    code = "ReservedForMaintenance" if w.maint else "Reservation"
    if w.start <= now:
        what = f"its hosts are in {w.describe(now)}"
    else:
        what = (f"its hosts are in {w.describe(now)}, and this job's expected runtime "
                f"({format_duration(runtime)}) would end after the window starts")
    return Pending(code, f"fits now only on hosts of {w.kind} {w.name!r}: {what}",
                   {"reservation": w.name, "window_start": w.start, "window_end": w.end,
                    "reservation_hosts": list(w.hosts)})


def full(w: Window, runtime: float, end: float, now: float,
         holders: list[tuple[str, int]] | None = None) -> Pending:
    """A job inside its window that cannot start there now: the window is full (no
    placement: `holders`, the jobs holding its GPUs, most first), or what is left of it
    is too short for the job."""
    details = {"reservation": w.name, "window_start": w.start, "window_end": w.end,
               "reservation_hosts": list(w.hosts)}
    if holders is not None:
        if not holders:
            return Pending("Reservation", f"its reservation {w.name!r} ({', '.join(w.hosts)})"
                           " has no room for it now; it starts there as room frees up",
                           details)
        details["held_by"] = dict(holders[:HOLDERS_KEPT])
        who = ", ".join(f"{j} ({n})" for j, n in holders[:3])
        more = f" and {len(holders) - 3} more jobs" if len(holders) > 3 else ""
        return Pending("Reservation", f"its reservation {w.name!r} ({', '.join(w.hosts)}) "
                       f"is full: held by {who}{more}; it starts there as they end", details)
    if end > w.end:
        return Pending("Reservation", f"its expected runtime ({format_duration(runtime)}) "
                       f"would end after its reservation {w.name!r} does (in "
                       f"{format_duration(w.end - now)}); a job in a reservation is "
                       "stopped at its end", details)
    return Pending("Reservation", f"its reservation {w.name!r} ({', '.join(w.hosts)}) has "
                   "no room for it now; it starts there as the reservation's jobs end",
                   details)


def holders(state, w: Window) -> list[tuple[str, int]]:
    """The jobs holding GPUs on the window's hosts (job, GPUs), most first."""
    hosts, counts = set(w.hosts), {}
    for job, allocs in state.allocations.items():
        n = sum(a.gpu_mask.bit_count() for a in allocs if a.host.name in hosts)
        if n:
            counts[job] = n
    return sorted(counts.items(), key=lambda x: (-x[1], x[0]))


def too_long(w: Window, spec: JobSpec, runtime: float, now: float,
             end: str | None = None, asked: float | None = None) -> str | None:
    """Why a job can never end inside its window (it starts at the window's start or
    now, whichever is later): its planned `runtime` passes the window's end, or the time
    limit it `asked` for does (its spec's; a class's default limit is cut at the end).
    Names the field; None if it fits. `end`: the window's end as the caller shows it
    (else: in how long)."""
    left = w.end - max(now, w.start)
    if asked is not None and asked > left:
        field, value = "time_limit", format_duration(asked)
    elif runtime <= left:
        return None
    elif spec.time_limit is not None and runtime >= spec.time_limit:
        field, value = "time_limit", format_duration(runtime)
    elif spec.expected_runtime is not None:
        field, value = "expected_runtime", format_duration(runtime)
    else:
        field, value = "expected_runtime", (f"not given (the policy's default_runtime, "
                                            f"{format_duration(runtime)})")
    most = at_most(left)
    when = end or f"in {format_duration(max(0.0, w.end - now))}"
    if end or w.start > now:          # "in 2h" says the rest already
        when += f", {most} {'after its start' if w.start > now else 'from now'}"
    return (f"{field}: {value} would end after its reservation {w.name!r} does ({when}"
            f"); a job in a reservation must end inside it: give "
            f"{'an' if field[0] in 'aeiou' else 'a'} {field} of at most {most}, or ask an "
            f"admin to extend the reservation (airflow-gpu reserve update {w.name} --end "
            "WHEN)")


def at_most(seconds: float) -> str:
    """The longest time that fits in `seconds`, as a user would type it: whole minutes
    (2h, 1h59m), whole seconds under a minute."""
    return format_duration(seconds // 60 * 60 if seconds >= 60 else max(0, int(seconds)))


def choose_hosts(cluster, gpus: int, model: str | None, taken: set[str],
                 cost=lambda host: 0.0) -> list[str]:
    """The whole hosts a reservation of `gpus` GPUs (of `model`, a substring of the GPU
    name) takes: the fewest, cheapest first (`cost`: e.g. the work running there past
    the start), none of `taken` (other reservations' in the same time). Raises ValueError
    naming what there is when the cluster cannot give them."""
    fits = [h for h in cluster.hosts if h.type.n_gpus and h.name not in taken
            and (model is None or model.lower() in h.type.gpu_name[0].lower())]
    fits.sort(key=lambda h: (-h.type.n_gpus, cost(h.name), h.index))
    chosen, got = [], 0
    for h in fits:
        if got >= gpus:
            break
        chosen.append(h.name)
        got += h.type.n_gpus
    if got < gpus:
        what = f" {model}" if model else ""
        raise ValueError(f"the cluster has {got}{what} GPUs on hosts no other reservation "
                         f"holds then, fewer than the {gpus} asked")
    return chosen
