"""Pending reasons of a pass: why a job waits, with numbers, and when it could start.

Only computed when a driver asks (`plan`, the service's passes); the simulator's passes
never pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.cluster import TIERS
from ..engine.hosttype import bits
from ..engine.placement import Placed, never_fits, place
from ..units import format_duration
from .reservations import earliest_end
from .types import Pending
from .windows import WindowHold, blocked_by

if TYPE_CHECKING:
    from .reservations import Reservation
    from .types import PassView, QueuedJob


def quota_wait(job: QueuedJob, quota: int, held: int) -> Pending:
    return Pending("Quota", (f"team {job.team!r} holds {held} GPUs of its quota_gpus {quota}; "
                             f"this job needs {job.gpus} more"),
                   {"quota_gpus": quota, "held_gpus": held})


def locality_wait(job: QueuedJob, now: Reservation, better: Reservation,
                  t: float) -> Pending:
    d = format_duration
    return Pending(
        "Locality",
        f"waits {d(better.start - t)} for a placement {TIERS[better.tier]} on "
        f"{', '.join(better.hosts)}: expected to end in {d(better.end - t)}, against "
        f"{d(now.end - t)} if it started now {TIERS[now.tier]} (locality slowdown)",
        {"reserved_hosts": better.hosts, "tier": TIERS[better.tier],
         "end_if_waiting_s": round(better.end - t), "end_if_started_now_s": round(now.end - t)},
        better.start - t)


class Reasons:
    """The pass's reasons for blocked jobs; jobs of one shape share one (not its ETA)."""

    def __init__(self, p: PassView):
        self.p = p
        self._why: dict[tuple, Pending | tuple] = {}
        self._eta: dict[tuple, float | None] = {}
        # upcoming.py: victims named by a preemption to come, the pool they come from,
        # kinds of jobs that found none, how many more jobs it looks for one for
        self.will_preempt: set[str] = set()
        self.soon_pool: list | None = None
        self.no_victims_soon: dict[tuple, float] = {}
        self.searches_left = 16                # (upcoming.py: each costs placements)

    def blocked(self, job: QueuedJob, protected: bool, reserved: Reservation | None) -> Pending:
        why = self.reason(job)
        p = self.p
        if reserved is not None:
            why.eta = reserved.planned_start - p.now
            why.details["reserved_hosts"] = reserved.hosts
            gpus: dict[str, list[int]] = {}
            for a in reserved.allocations:
                gpus.setdefault(a.host.name, []).extend(a.gpus)
            why.details["reserved_gpus"] = {h: sorted(g) for h, g in gpus.items()}
        else:
            why.eta = self.eta(job)
            if p.mode == "backfill" and not protected:
                protect = p.s.queue.protect_due(job) + p.s.config.reserve_after - p.now
                if protect > 0:
                    why.details["protected_in_s"] = round(protect)
                    why.message += (f"; smaller jobs may go first until the wait "
                                    f"guarantee protects it ({format_duration(protect)} "
                                    "from now: reserve_after, longer for larger jobs)")
                else:
                    why.message += "; it is protected once older waiting jobs have started"
        return why

    def reason(self, job: QueuedJob) -> Pending:
        """Why the job cannot start now. Placement is asked once per job shape; only the
        runtime in the message is the job's own."""
        p = self.p
        s = p.s
        if job.shape not in self._why:
            p.plan.hold_first(0)
            got = place(job.spec, s.state, s.reg, job.needs)
            if isinstance(got, Placed):
                blocker = next((r for r in p.reservations if r.overlaps(got.allocations)),
                               None)
                self._why[job.shape] = (blocker, got.tier)
            else:
                code, msg, details = got.explain()
                self._why[job.shape] = why = Pending(code, msg, details)
                self._unhealthy(job, why)
                if why.code != "Unhealthy":
                    self._on_drained(job, why)
        cached = self._why[job.shape]
        if isinstance(cached, Pending):
            return Pending(cached.code, cached.message, dict(cached.details))
        r, tier = cached
        if r is None:
            return Pending("Priority", "fits now, but not around the reservations of "
                           "higher-priority jobs", {})
        if isinstance(r, WindowHold):
            return blocked_by(r.window, job, s.runtime(job, tier), p.now)
        return Pending("Priority", (
            f"fits now, but on resources reserved for {r.job.name!r} (priority "
            f"{r.job.base:g}) from {format_duration(r.start - p.now)} on, on "
            f"{', '.join(r.hosts)}; this job's expected runtime "
            f"({format_duration(s.runtime(job, tier))}) would end after that"),
            {"reservation_for": r.job.name})

    def _unhealthy(self, job: QueuedJob, why: Pending) -> None:
        s = self.p.s
        state = s.state
        bad = [h.name for h, hs in zip(state.cluster.hosts, state.hosts, strict=True)
               if hs.drained or hs.bad_gpus]
        if not bad:
            return
        healthy = state.empty_like()
        for h in bad:
            hs = state.hosts[state.cluster.by_name[h].index]
            healthy.set_drained(h, hs.drained)
            healthy.set_unhealthy_gpus(h, bits(hs.bad_gpus))
        if never_fits(job.spec, healthy, s.reg, job.needs):
            why.code = "Unhealthy"
            why.message += (f"; it can only run once drained or unhealthy hosts are back "
                            f"({', '.join(map(self._label, bad[:5]))}"
                            f"{' ...' if len(bad) > 5 else ''})")
            why.details["unhealthy_hosts"] = bad
            drained = {h: state.drain_reasons.get(h) for h in bad
                       if state.hosts[state.cluster.by_name[h].index].drained}
            if drained:
                why.details["drained_hosts"] = drained

    def _label(self, host: str) -> str:
        """A host, with why it takes no new work when it is drained or unreachable."""
        state = self.p.s.state
        if not state.hosts[state.cluster.by_name[host].index].drained:
            return host
        why = state.drain_reasons.get(host)
        if why is None or why == "unreachable":
            return f"{host} ({why or 'drained'})"
        return f"{host} (reason: {why})"

    def _on_drained(self, job: QueuedJob, why: Pending) -> None:
        """Free capacity on drained (or unreachable) hosts that would start the job now:
        named, with each host's drain reason (Slurm's sinfo -R)."""
        s = self.p.s
        state = s.state
        drained = [h.name for h, hs in zip(state.cluster.hosts, state.hosts, strict=True)
                   if hs.drained]
        if not drained:
            return
        epoch = state.epoch
        for h in drained:
            state.set_drained(h, False)
        try:
            got = place(job.spec, state, s.reg, job.needs)
        finally:
            for h in drained:
                state.set_drained(h, True)
            state.epoch = epoch        # nothing changed for the pass's plans
        if not isinstance(got, Placed):
            return
        on = [h for h in dict.fromkeys(a.host.name for a in got.allocations) if h in drained]
        if not on:
            return
        there = sum(len(a.gpus) for a in got.allocations if a.host.name in on)
        hosts = f"drained hosts {', '.join(map(self._label, on))}"
        if job.gpus and there < job.gpus:     # the rest on hosts in service
            why.message += (f"; it fits now only with {hosts}, which would hold {there} of "
                            f"its {job.gpus} GPUs")
        else:
            what = (f"{job.gpus} GPU{'s fit' if job.gpus > 1 else ' fits'}" if job.gpus
                    else "it fits")
            why.message += f"; {what} now only on {hosts}"
        why.details["drained_hosts"] = {h: state.drain_reasons.get(h) for h in on}

    def eta(self, job: QueuedJob) -> float | None:
        """When the job could start around this pass's reservations (not reserved itself)."""
        p = self.p
        if p.mode == "count" or p.head not in (None, job):
            return None
        if job.shape not in self._eta:
            s = p.s
            p.plan.hold_first(0)
            r = earliest_end(job, s.state, s.reg, p.now, p.reservations,
                             lambda tier: s.runtime(job, tier), s.best_tier(job))
            self._eta[job.shape] = None if r is None else r.start - p.now
        return self._eta[job.shape]
