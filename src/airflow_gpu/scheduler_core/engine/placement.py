"""Placing a whole job (a gang) onto the cluster: which hosts, and which replica goes where.

Rules, in order of weight:
1. All replicas or none (the trial works on copies; nothing changes unless it succeeds).
2. Locality is hard: with `locality: switch|rack|host` every host of the job shares
   one switch|rack, or the job runs on one host; with `nvlink_domain`, one multi-node
   NVLink domain (a host without one is a domain of its own).
3. Fewest hosts (`pack: true`): the whole job on one host if any can hold it; else
   inside one NVLink domain if one can hold it (its hosts talk over NVLink, as GPUs of
   one host do); else the fewest hosts, then hosts sharing a switch, then a rack
   (`locality: any`): the tiers host < nvlink_domain < switch < rack < cluster.
   Spread (`pack: false`): one replica per host first, on as many hosts as the
   locality allows (then the tighter tier), then the least loaded of the job's hosts.
4. Least capable GPUs first (capability.py), unless the job names a model or hosts.
5. Tight fit: the host (and switch) with the fewest free GPUs that still fits, so
   whole hosts stay free for big jobs.
6. CPU-only roles (parameter servers) go onto the hosts of the job's GPU roles,
   else onto hosts under the same switch.
Plugin host scorers (plugins.HostScorer) rank the hosts that fit: across the domain
when a job spreads; for one host, among the tightest hosts that fit, or past them up
to a host reaching every scorer's `max_score` when all of them declare one. Scorers
whose `applies(state)` is false are left out of the trial; with none left, the first
fitting host is taken as if no scorer were loaded.
Within a host, `fit.fit_replica` chooses GPUs, cores, memory and NICs.
"""

from __future__ import annotations

from ..jobspec import JobSpec
from ..plugins import Registry
from .explain import pending_reason, unknown_hosts, why_never
from .need import Need
from .placed import Placed, Unplaced
from .state import ClusterState
from .trial import Trial

TIERS = {"host": ("host",), "nvlink_domain": ("nvlink_domain",), "switch": ("switch",),
         "rack": ("rack",), "any": ("nvlink_domain", "switch", "rack", "cluster")}
# the locality that keeps a placement within a slowdown tier (0 one host or NVLink domain,
# 1 one switch); tier 0 is one host where the cluster has no NVLink domains
_WITHIN = {0: "nvlink_domain", 1: "switch"}
_STRICTNESS = {"host": 0, "nvlink_domain": 1, "switch": 2, "rack": 3, "any": 4}
# how a pending reason names the domain a hard locality asks for
WITHIN_LABEL = {"host": "one host", "nvlink_domain": "one NVLink domain",
                "switch": "one switch", "rack": "one rack"}
# After a domain fits, look at this many more domains of the tier for a better one.
_EXTRA_DOMAINS = 3


def compile_needs(job: JobSpec) -> list[Need]:
    """Needs of each role, GPU roles first (largest replicas first), then CPU-only roles."""
    p = job.placement
    needs = [Need(r.name, r.replicas, r.gpus, r.cpus, r.booked_memory(),
                  tuple(r.gpu.model) if r.gpu.model else None,
                  r.gpu.min_memory or 0, p.affinity, p.nics, p.cpu_allocation == "core",
                  r.gpu.mig.profile if r.gpu.mig else None,
                  r.gpu.mig.count if r.gpu.mig else 0)
             for r in job.roles]
    # MIG roles go with the GPU roles (before CPU-only ones: they stay near them)
    return sorted(needs, key=lambda n: (n.gpus == 0 and not n.mig, -n.gpus, -n.slices,
                                        -n.cpus))


def place(job: JobSpec, state: ClusterState, reg: Registry,
          needs: list[Need] | None = None, within: int | None = None) -> Placed | Unplaced:
    """Where the whole job would go now, without changing `state`; with `within` (a
    slowdown tier), only placements of that tier or better."""
    needs = needs or compile_needs(job)
    trial = Trial(job, needs, state, reg)
    p = job.placement
    locality = p.locality
    if within in _WITHIN and _STRICTNESS[_WITHIN[within]] < _STRICTNESS[locality]:
        locality = _WITHIN[within]
        if locality == "nvlink_domain" and not state.cluster.nvlink_domains:
            locality = "host"         # no multi-node domain: tier 0 is one host
    replicas = sum(n.replicas for n in needs)
    # a spread job spans the hosts of an NVLink domain where the cluster has them
    spans_domain = not p.pack and locality == "nvlink_domain" and state.cluster.nvlink_domains
    if (p.pack or replicas == 1 or locality == "host"
            or (locality == "nvlink_domain" and not spans_domain)):
        got = trial.single_host()
        if got:
            return Placed(got)
    if locality == "host" or replicas == 1:  # one replica cannot span hosts
        return _unplaced(trial, "one host" if locality == "host" else "")
    lower_bound = max(1, -(-trial.total_gpus // (state.cluster.max_host_gpus or 1)))
    # spread: one replica per host, on as many hosts as there can be
    most_hosts = min(replicas, len(state.cluster.hosts))
    lowest = trial.rank.levels[0]
    best = None
    for rank, tier in enumerate(TIERS[locality]):
        extra = None
        for label, domain in trial.domains(tier):
            got = trial.fill(domain, label)
            if got is None:
                continue
            hosts = {a.host.index for a in got}
            switches = {a.host.switch_key for a in got}
            leftover = sum(state.hosts[i].usable_gpus.bit_count() for i in hosts)
            level = trial.rank.of_placement(got)
            # spread: the most hosts first; a placement inside one NVLink domain beats
            # any other (tier 0 slowdown); then fewest hosts (pack), the tier, ...
            key = (0 if p.pack else -len(hosts), tier != "nvlink_domain",
                   len(hosts) if p.pack else 0, rank, len(switches), level,
                   leftover - trial.total_gpus)
            if best is None or key < best[0]:
                best = (key, got)
            if p.pack and len(hosts) == lower_bound and level == lowest:
                return Placed(best[1])
            extra = _EXTRA_DOMAINS if extra is None else extra - 1
            if extra <= 0:
                break
        if best is not None and (-best[0][0] == most_hosts if not p.pack else
                                 tier == "nvlink_domain" or best[0][2] == lower_bound):
            break
    if best is not None:
        return Placed(best[1])
    if spans_domain:       # no multi-node domain holds it: one host is a domain too
        got = trial.single_host()
        if got:
            return Placed(got)
    return _unplaced(trial, WITHIN_LABEL.get(locality, ""))


def _unplaced(trial: Trial, within: str) -> Unplaced:
    """Explained when first read, from the trial as it was (see Unplaced)."""
    return Unplaced(lambda: pending_reason(trial, within))


def never_fits(job: JobSpec, empty: ClusterState, reg: Registry,
               needs: list[Need] | None = None) -> str | None:
    """None if the job fits the empty cluster, else why it never can."""
    if job.placement.hosts and (why := unknown_hosts(job.placement.hosts, empty.cluster)):
        return why          # a misspelt host name: never wait for it
    needs = needs or compile_needs(job)
    if isinstance(place(job, empty, reg, needs), Placed):
        return None

    within = WITHIN_LABEL.get(job.placement.locality, "")
    return why_never(Trial(job, needs, empty, reg), within)
