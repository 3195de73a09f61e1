"""Why a job waits (with numbers) and why a job can never run (naming the constraint)."""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from ..units import format_size
from . import migfit
from .capability import host_types
from .fit import fit_replica
from .migfit import HOLDERS_KEPT
from .need import Need
from .state import HostState

if TYPE_CHECKING:
    from .state import ClusterState
    from .trial import Trial


def describe_need(n: Need) -> str:
    parts = []
    if n.gpus:
        cons = []
        if n.models:
            cons.append("|".join(n.models))
        if n.min_gpu_memory:
            cons.append(f">={format_size(n.min_gpu_memory)}")
        parts.append(f"{n.gpus} GPU" + ("s" if n.gpus > 1 else "")
                     + (f" [{', '.join(cons)}]" if cons else ""))
    if n.mig:
        parts.append(migfit.describe(n))
    parts.append(f"{n.cpus} CPU" + ("s" if n.cpus > 1 else ""))
    parts.append(format_size(n.memory))
    return f"{n.role} {n.replicas}x({', '.join(parts)})"


def describe_needs(needs: list[Need]) -> str:
    return " + ".join(describe_need(n) for n in needs)


def _host_free(state: ClusterState, needs: list[Need], h) -> str:
    hs = state.hosts[h.index]
    gpu_needs = [n for n in needs if n.gpus]
    elig = (hs.usable_gpus & gpu_needs[0].eligible(h.type)).bit_count() if gpu_needs else None
    gpus = f"{elig} eligible GPUs, " if elig is not None else ""
    return f"{gpus}{hs.n_cpus()} CPUs, {format_size(sum(hs.free_mem))} free"


def pending_reason(trial: Trial, within: str) -> tuple[str, str, dict]:
    """(code, message, details) for a job that cannot be placed now."""
    state, needs = trial.state, trial.needs
    what = describe_needs(needs) + (f" under {within}" if within else "")
    if trial.only is not None:          # the local runner's worker host, or a host list
        only = sorted(trial.only)
        what += (f" on {', '.join(only[:5])}{' ...' if len(only) > 5 else ''} "
                 "(placement.hosts)")
    gpu_need = next((n for n in needs if n.gpus), None)
    # only the hosts it may use count (placement.hosts, filters, enough eligible GPUs)
    usable = _usable(trial, gpu_need) if gpu_need else []
    free = _free_on(state, gpu_need, usable) if gpu_need else 0
    details: dict = {"needs_gpus": trial.total_gpus, "cluster_free_gpus": free}
    code = "Resources"
    whole = state.cluster.hosts
    if (within in ("one switch", "one rack", "one NVLink domain") and free >= trial.total_gpus
            and trial.fill(whole, "the whole cluster")):
        code = "Locality"
    p = trial.progress
    if gpu_need and not free:
        best = "no eligible GPU is free"
    elif within == "one NVLink domain":
        best = _largest_free_domain(trial, gpu_need, details)
    elif p.score >= 0 and within != "one host":
        best = (f"best candidate {p.domain} holds {p.placed} of {p.wanted} '{p.role}' "
                f"replicas ({p.free_gpus} eligible GPUs free on {p.hosts} hosts)")
        details.update(best=p.domain, best_placed=p.placed, best_free_gpus=p.free_gpus)
    else:
        h = _best_host(trial, gpu_need)
        if h is not None:
            best = f"best host {h.name} has {_host_free(state, needs, h)}"
            details["best"] = h.name
        else:
            best = "no usable host has eligible GPUs"
    where = ("the cluster has" if trial.only is None else
             "its host has" if len(trial.only) == 1 else "its hosts have")
    msg = f"needs {what}; {best}; {where} {free} eligible GPUs free"
    if code == "Locality":
        msg += f" in all, but not under {within}"
    if gpu_need:
        held = _holders(state, gpu_need, {h.index for h in usable})
        if held:     # the largest holders: a reason stays small however many there are
            details["held_by"] = dict(held[:HOLDERS_KEPT])
            if len(held) > HOLDERS_KEPT:
                details["held_by_more"] = len(held) - HOLDERS_KEPT
            msg += "; held by " + ", ".join(f"{j} ({n})" for j, n in held[:3])
            msg += f" and {len(held) - 3} more jobs" if len(held) > 3 else ""
    mig_need = next((n for n in needs if n.mig), None)
    if mig_need:           # the MIG devices it waits for, named (GPU 2 MIG 1g.10gb #3)
        note, more = migfit.pending_note(state, mig_need)
        details.update(more)
        msg = (f"{msg}; {note}" if gpu_need else f"needs {what}; {note}"
               + (f", but not under {within}" if code == "Locality" else ""))
    return code, msg, details


def _largest_free_domain(trial: Trial, gpu_need: Need | None, details: dict) -> str:
    """The NVLink domain with the most eligible GPUs free now (Slurm's topology/block
    says the same of blocks)."""
    state = trial.state
    domains = state.cluster.nvlink_domains
    if not domains:
        h = _best_host(trial, gpu_need)
        free = _host_free(state, trial.needs, h) if h is not None else "nothing usable"
        return ("no host is in a multi-node NVLink domain (cluster file: nvlink_domain), so "
                f"it must fit one host; the best host {h.name if h else '-'} has {free}")

    def free_of(hosts) -> int:
        return sum((state.hosts[h.index].usable_gpus & gpu_need.eligible(h.type)).bit_count()
                   for h in hosts) if gpu_need else 0

    name, hosts = max(domains.items(), key=lambda kv: free_of(kv[1]))   # ties: first
    n = free_of(hosts)
    details.update(best=name, best_free_gpus=n)
    usable = sum(not state.hosts[h.index].drained for h in _eligible_hosts(trial, hosts))
    return (f"the largest free NVLink domain, {name}, has {n} eligible GPU"
            f"{'s' if n != 1 else ''} free on {_hosts(usable)}")


def _best_host(trial: Trial, gpu_need: Need | None):
    """The usable host with the most eligible free GPUs (then most free cores); buckets of
    hosts by free GPUs are walked from the top, so a busy cluster is not scanned whole."""
    state, best, best_key = trial.state, None, None
    for n_free in range(len(state.by_free) - 1, -1, -1):
        if best_key is not None and best_key[0] > n_free:
            break
        for i in state.by_free[n_free]:
            h = state.cluster.hosts[i]
            hs = state.hosts[i]
            if hs.drained or not all(trial.allowed(n, h) for n in trial.needs):
                continue
            elig = (hs.usable_gpus & gpu_need.eligible(h.type)).bit_count() if gpu_need else 0
            key = (elig, hs.n_cpus() if not gpu_need else 0, -i)
            if best_key is None or key > best_key:
                best, best_key = h, key
    return best


def _usable(trial: Trial, need: Need) -> list:
    """The hosts in service the need may use (Trial.allowed)."""
    state, hosts = trial.state, trial.state.cluster.hosts
    if trial.only is not None or trial.reg.filters:
        return [h for h in hosts if not state.hosts[h.index].drained and trial.allowed(need, h)]
    # without placement.hosts or filters, whether it may use a host depends on its type
    ok = {key: trial.allowed(need, h) for key, h in {id(h.type): h for h in hosts}.items()}
    return [h for h, hs in zip(hosts, state.hosts, strict=True)
            if ok[id(h.type)] and not hs.drained]


def _free_on(state: ClusterState, need: Need, hosts) -> int:
    if len(hosts) == len(state.hosts) and all(
            need.eligible(t) == t.all_gpus for t in host_types(state.cluster)):
        return state.usable_total      # every GPU of every host
    return sum((state.hosts[h.index].usable_gpus & need.eligible(h.type)).bit_count()
               for h in hosts)


def _holders(state: ClusterState, need: Need, usable: set[int]) -> list[tuple[str, int]]:
    """Jobs holding GPUs this need could use (eligible, on hosts it may use), most first."""
    hosts = state.cluster.hosts
    if len(usable) == len(hosts) and all(
            need.eligible(t) == t.all_gpus for t in host_types(state.cluster)):
        return list(_all_holders(state))
    counts: dict[str, int] = {}
    eligible = {i: need.eligible(hosts[i].type) for i in usable}.get   # None: not usable
    for job, allocs in state.allocations.items():
        n = 0
        for a in allocs:
            if a.gpu_mask and (m := eligible(a.host.index)):
                n += (a.gpu_mask & m).bit_count()
        if n:
            counts[job] = n
    return _most_first(counts)


# per state: the GPUs each job held when `_all_holders` last sorted them, and the sorted
# list. Pending reasons count holders for one shape after another, mostly with the same
# jobs running; the counts are compared each time, so it cannot go stale
_ALL_HELD: WeakKeyDictionary = WeakKeyDictionary()


def _all_holders(state: ClusterState) -> list[tuple[str, int]]:
    """_holders for a need that may use every GPU of every host: all of each job's GPUs."""
    memo = _ALL_HELD.get(state)
    if memo is not None and memo[0] == state.gpus_held:
        return memo[1]
    held = _most_first({job: n for job, n in state.gpus_held.items() if n})
    _ALL_HELD[state] = (dict(state.gpus_held), held)
    return held


def _most_first(counts: dict[str, int]) -> list[tuple[str, int]]:
    held = sorted(counts.items())                    # by name, then (stable) most first
    held.sort(key=itemgetter(1), reverse=True)
    return held


def why_never(trial: Trial, within: str) -> str:
    """Why the job cannot run even on the empty cluster: the constraint, and the fix."""
    cluster = trial.state.cluster
    types = {id(h.type): h.type for h in cluster.hosts}.values()
    for n in trial.needs:
        if n.mig and (why := migfit.never_reason(cluster, n)):
            return why
        if not n.gpus:
            continue
        counts = {t.model: n.eligible(t).bit_count() for t in types}
        if not any(counts.values()):
            have = ", ".join(sorted({f"{t.gpu_name[0]} ({format_size(t.gpu_mem[0])})"
                                     for t in types if t.n_gpus}))
            return (f"role '{n.role}': no GPU in the cluster meets gpu "
                    f"{_constraint(n)}; the cluster has {have or 'no GPUs'}")
        if max(counts.values()) < n.gpus:
            h = max(cluster.hosts, key=lambda h: (n.eligible(h.type).bit_count(), -h.index))
            return (f"role '{n.role}': asks {n.gpus} GPUs per replica but the largest host, "
                    f"{h.name} ({h.type.model}), has {n.eligible(h.type).bit_count()} such "
                    "GPUs; use more replicas with fewer GPUs")
    for n in trial.needs:
        hosts = [h for h in cluster.hosts if trial.allowed(n, h)]
        if not hosts and trial.only is not None:
            return (f"role '{n.role}': no host of placement.hosts ({', '.join(sorted(trial.only))}"
                    f") can hold a replica ({describe_needs([n])}) even when idle; the job may "
                    "use no other host: add hosts to placement.hosts or shrink the role")
        if not hosts:
            return f"role '{n.role}': every host is excluded by a placement filter"
        samples = list({id(h.type): h for h in hosts}.values())
        if any(fit_replica(h.type, HostState.empty(h), n) for h in samples):
            continue
        loose = Need(n.role, 1, n.gpus, n.cpus, n.memory, n.models, n.min_gpu_memory,
                     "none", False, n.whole_cores, n.mig, n.slices)
        if (n.gpus or n.mig) and any(fit_replica(h.type, HostState.empty(h), loose)
                                     for h in samples):
            local_cpus = max(h.type.numa_cpus[h.type.gpu_numa[0]].bit_count() for h in samples)
            local_mem = max(h.type.numa_mem[h.type.gpu_numa[0]] for h in samples)
            return (f"role '{n.role}': placement.affinity '{n.affinity}' needs {n.cpus} CPUs "
                    f"and {format_size(n.memory)} on the NUMA node(s) of {n.gpus} GPU(s), but "
                    f"a GPU's NUMA node has at most {local_cpus} CPUs and "
                    f"{format_size(local_mem)}; lower cpus/memory or set placement.affinity: "
                    "preferred")
        return (f"role '{n.role}': one replica needs {n.cpus} CPU{'s' if n.cpus != 1 else ''}"
                f" and {format_size(n.memory)} but {_largest_hosts(hosts, n)}")
    if within:
        return (f"the whole job ({describe_needs(trial.needs)}) must fit {within}, and even "
                f"an empty {within.removeprefix('one ')} cannot hold it: "
                f"{_largest_domain(trial, within)}; relax placement.locality or shrink the job")
    if trial.only is not None:
        only = [h for h in cluster.hosts if h.name in trial.only]
        return (f"the job does not fit even on the idle hosts of placement.hosts "
                f"({', '.join(sorted(trial.only))}): needs {describe_needs(trial.needs)}, "
                f"they have {_eligible_total(trial, only)} eligible GPUs; add hosts to "
                "placement.hosts or shrink the job")
    return ("the job does not fit even on the empty cluster: "
            f"needs {describe_needs(trial.needs)}, the cluster has {_totals(trial)}")


def _largest_hosts(hosts, n: Need) -> str:
    """The hosts that are really the largest in what a replica lacks: CPUs, memory, or
    (when each alone would do) both at once."""
    def has(h) -> str:
        return f"has {h.type.total_cpus} CPUs and {format_size(h.type.total_mem)}"

    def named(h) -> str:
        return f"{h.name} ({h.type.model})"

    cpu = max(hosts, key=lambda h: (h.type.total_cpus, h.type.total_mem, -h.index))
    mem = max(hosts, key=lambda h: (h.type.total_mem, h.type.total_cpus, -h.index))
    short_cpus, short_mem = n.cpus > cpu.type.total_cpus, n.memory > mem.type.total_mem
    if cpu is mem:
        return f"the largest host, {named(cpu)}, {has(cpu)}"
    if short_cpus and short_mem:
        return (f"the host with the most CPUs, {named(cpu)}, {has(cpu)}, and the one with "
                f"the most memory, {named(mem)}, {has(mem)}")
    if short_cpus:
        return f"the host with the most CPUs, {named(cpu)}, {has(cpu)}"
    if short_mem:
        return f"the host with the most memory, {named(mem)}, {has(mem)}"
    return f"no host has both: {named(cpu)} {has(cpu)}; {named(mem)} {has(mem)}"


def unknown_hosts(names, cluster) -> str | None:
    """placement.hosts naming hosts the cluster lacks: which, and the names it has."""
    unknown = sorted(set(names) - cluster.by_name.keys())
    if not unknown:
        return None
    known = sorted(cluster.by_name)
    shown = ", ".join(known[:12]) + (" ..." if len(known) > 12 else "")
    return (f"placement.hosts: {', '.join(repr(u) for u in unknown[:8])} "
            f"{'is no host' if len(unknown) == 1 else 'are no hosts'} of the cluster "
            f"'{cluster.name}' (its hosts: {shown}); use the names of the cluster file")


def _constraint(n: Need) -> str:
    parts = []
    if n.models:
        parts.append(f"model {list(n.models)}")
    if n.min_gpu_memory:
        parts.append(f"min_memory {format_size(n.min_gpu_memory)}")
    return " and ".join(parts) or "(none)"


def _eligible_total(trial: Trial, hosts) -> int:
    n = next((n for n in trial.needs if n.gpus), None)
    return sum(n.eligible(h.type).bit_count() for h in _eligible_hosts(trial, hosts)) if n else 0


def _eligible_hosts(trial: Trial, hosts) -> list:
    """The hosts the job's GPU role may use (placement.hosts, filters, enough eligible
    GPUs for a replica); for a job without GPUs, those its first role may use."""
    n = next((n for n in trial.needs if n.gpus), trial.needs[0])
    return [h for h in hosts if trial.allowed(n, h)]


def _hosts(n: int) -> str:
    return f"{n} host{'s' if n != 1 else ''}"


def _totals(trial: Trial) -> str:
    hosts = _eligible_hosts(trial, trial.state.cluster.hosts)
    return f"{_eligible_total(trial, hosts)} eligible GPUs on {_hosts(len(hosts))}"


def _largest_domain(trial: Trial, within: str) -> str:
    c = trial.state.cluster
    if within == "one host":
        usable = [h for h in c.hosts if all(trial.allowed(n, h) for n in trial.needs)]
        if not usable:
            return "no host can hold one replica of each role"
        h = max(usable, key=lambda h: (_eligible_total(trial, [h]), h.type.total_cpus,
                                       h.type.total_mem))
        return (f"the largest host {h.name} has {_eligible_total(trial, [h])} eligible GPUs, "
                f"{h.type.total_cpus} CPUs, {format_size(h.type.total_mem)}")
    groups = {"one switch": c.switches, "one rack": c.racks,
              "one NVLink domain": c.nvlink_domains}[within]
    if not groups:      # no multi-node NVLink domain: each host is one
        return ("no host is in a multi-node NVLink domain (cluster file: nvlink_domain); "
                + _largest_domain(trial, "one host"))
    key, hosts = max(groups.items(), key=lambda kv: (_eligible_total(trial, kv[1]), len(kv[1])))
    name = key[1] if isinstance(key, tuple) else key
    return (f"the largest, {name}, has {_eligible_total(trial, hosts)} eligible GPUs on "
            f"{_hosts(len(_eligible_hosts(trial, hosts)))}")
