"""One placement trial: a job's needs against a cluster state, tried domain by domain on
copies of the state (placement.place drives it; explain.py reads what it got)."""

from __future__ import annotations

from ..jobspec import JobSpec
from ..plugins import Registry
from .capability import host_types, ranking
from .cluster import Host
from .fit import allocate_replica
from .hostorder import HostOrder
from .migfit import host_order
from .need import Need, mig_eligible
from .placed import Progress
from .state import ClusterState, HostState, ReplicaAllocation


class Trial:
    def __init__(self, job: JobSpec, needs: list[Need], state: ClusterState, reg: Registry):
        self.job, self.needs, self.state, self.reg = job, needs, state, reg
        self.roles = {r.name: r for r in job.roles}
        self.total_gpus = sum(n.gpus * n.replicas for n in needs)
        # the scorers that apply to this state (plugins.HostScorer.applies)
        self.scorers = [s for s in reg.scorers
                        if (applies := getattr(s, "applies", None)) is None or applies(state)]
        # the best score a host can reach, when every scorer says (HostScorer.max_score)
        self.max_score: float | None = None
        if self.scorers and all(hasattr(s, "max_score") for s in self.scorers):
            self.max_score = sum(s.max_score for s in self.scorers)
        self._allowed: dict[tuple[str, int], bool] = {}
        self.progress = Progress()
        # placement.hosts: the only hosts the job may use (the local runner's worker host)
        self.only = frozenset(job.placement.hosts) if job.placement.hosts else None
        self.rank = ranking(state.cluster, needs, self.only is not None
                            or any(n.models for n in needs))

    def allowed(self, need: Need, host: Host) -> bool:
        """Static per-host checks: placement.hosts, eligible GPUs exist, plugin filters."""
        if self.only is not None and host.name not in self.only:
            return False
        if need.gpus and need.eligible(host.type).bit_count() < need.gpus:
            return False
        if need.mig and mig_eligible(host.type, need).bit_count() < need.slices:
            return False
        if not self.reg.filters:
            return True
        key = (need.role, host.index)
        if key not in self._allowed:
            role = self.roles[need.role]
            self._allowed[key] = all(f(self.job, role, host) is None for f in self.reg.filters)
        return self._allowed[key]

    def score(self, need: Need, host: Host, hs: HostState) -> float:
        role = self.roles[need.role]
        return sum(s(self.job, role, host, hs) for s in self.scorers)

    # -- one host ------------------------------------------------------------------------
    def on_one_host(self, host: Host) -> list[ReplicaAllocation] | None:
        if not all(self.allowed(n, host) for n in self.needs):
            return None
        hs = self.state.hosts[host.index].copy()
        out = []
        for need in self.needs:
            for i in range(need.replicas):
                a = allocate_replica(host.type, hs, need, self.job.name, i, host)
                if a is None:
                    return None
                out.append(a)
        return out

    def single_host(self) -> list[ReplicaAllocation] | None:
        """The tightest single host that holds the whole job (hosts by free GPUs, ascending;
        ties: the lowest host index), on the least capable GPUs that can (capability.py).
        With scorers: the best-scored host of the tightest bucket that holds the job;
        with `max_score` known, later buckets are searched for a better-scored host
        until one reaches it (ties: the tighter host)."""
        for level in self.rank.levels:
            got = self._single_host(level)
            if got is not None:
                return got
        return None

    def _single_host(self, level: tuple) -> list[ReplicaAllocation] | None:
        hosts = self.state.cluster.hosts
        rank = self.rank

        def at_level(i: int) -> bool:
            return not rank.active or rank.level(hosts[i].type) == level

        if not self.scorers and not self.total_gpus and any(n.mig for n in self.needs):
            # MIG devices only: hosts whose MIG GPUs are partly used first (migfit)
            need = next(n for n in self.needs if n.mig)
            for h in host_order(self.state, need):
                got = self.on_one_host(h)
                if got is not None:
                    return got
            return None
        if not self.scorers:
            for bucket in self.state.by_free[self.total_gpus:]:
                # by host index: the same state gives the same choice, whatever order
                # hosts entered the bucket in
                for i in sorted(filter(at_level, bucket) if rank.active else bucket):
                    got = self.on_one_host(hosts[i])
                    if got is not None:
                        return got
            return None
        best, best_score = None, None
        for bucket in self.state.by_free[self.total_gpus:]:
            scored = []
            for i in bucket:
                if not at_level(i):
                    continue
                sc = sum(self.score(n, hosts[i], self.state.hosts[i]) for n in self.needs)
                if best_score is None or sc > best_score:
                    scored.append((-sc, i))
            # best score first, then host index: the first that holds the job is the
            # bucket's best
            for neg, i in sorted(scored):
                got = self.on_one_host(hosts[i])
                if got is not None:
                    best, best_score = got, -neg
                    break
            if best is not None and (self.max_score is None or best_score >= self.max_score):
                break
        return best

    # -- several hosts -------------------------------------------------------------------
    def fill(self, domain: list[Host], label: str) -> list[ReplicaAllocation] | None:
        """Greedy gang fill of one domain, or None (recording how far it got)."""
        pack = self.job.placement.pack
        scratch: dict[int, HostState] = {}
        used: dict[int, Host] = {}
        switches: set[tuple[str, str]] = set()
        load: dict[int, int] = {}         # the job's replicas per host
        bounds: dict[int, HostOrder] = {}     # per need: _order
        out: list[ReplicaAllocation] = []

        def hs_of(h: Host) -> HostState:
            if h.index not in scratch:
                scratch[h.index] = self.state.hosts[h.index].copy()
            return scratch[h.index]

        for need in self.needs:
            left, index, full = need.replicas, 0, set()
            while left:
                host = self._choose(need, left, domain, used, full, switches, hs_of, load,
                                    bounds)
                if host is None:
                    self._record(label, need, len(out), need.replicas - left, domain)
                    return None
                hs, placed = hs_of(host), 0
                while left and (not placed or pack):
                    a = allocate_replica(host.type, hs, need, self.job.name, index, host)
                    if a is None:
                        break
                    out.append(a)
                    left, index, placed = left - 1, index + 1, placed + 1
                if placed:
                    used[host.index] = host
                    load[host.index] = load.get(host.index, 0) + placed
                    switches.add(host.switch_key)
                if not placed or pack:
                    full.add(host.index)
        return out

    def _order(self, need: Need, domain: list[Host], bounds: dict) -> HostOrder:
        """The hosts of the domain the need may use, with the replicas each could take by
        counts, ranked on the live state (hostorder.py): a fill reads them for every
        replica, never changing them (it places on copies)."""
        found = bounds.get(id(need))
        if found is None:
            hosts = self.state.cluster.hosts
            if need.gpus and domain is hosts:
                # the whole cluster: only hosts with enough usable GPUs, from the index
                domain = [hosts[i] for b in self.state.by_free[need.gpus:] for i in b]
            cands = [(n, h) for h in domain if self.allowed(need, h)
                     and (n := need.upper_bound(h.type, self.state.hosts[h.index])) > 0]
            rank, live = self.rank, self.state.hosts

            def fixed(h: Host) -> tuple:
                hs = live[h.index]
                return (-self.score(need, h, hs) if self.scorers else 0,
                        rank.level(h.type) if need.gpus else (),   # least capable first
                        hs.usable_gpus.bit_count(), h.index)

            found = bounds[id(need)] = HostOrder(cands, fixed)
        return found

    def _choose(self, need, left, domain, used, full, switches, hs_of, load,
                bounds) -> Host | None:
        """The host for the next replicas: with `pack`, the job's own host with most room;
        else by the rank (hostorder.HostOrder): the best score, hosts under the job's
        switches, hosts that take all that is left, least capable GPUs, the tightest that
        fits (else the roomiest), fewest usable GPUs."""
        pack = self.job.placement.pack
        if pack:
            # Concentrate: the job's own hosts first, the one with most room.
            mine = [(need.upper_bound(h.type, hs_of(h)), h) for h in used.values()
                    if h.index not in full and self.allowed(need, h)]
            mine = [(n, h) for n, h in mine if n > 0]
            if mine:
                return max(mine, key=lambda x: (x[0], -x[1].index))[1]
        got = self._order(need, domain, bounds).choose(left if pack else 1, switches,
                                                       used, full)
        if got is None and not pack:   # every host has one: the least loaded of the job's
            mine = [(load.get(h.index, 0), -n, h.index, h) for h in used.values()
                    if h.index not in full and self.allowed(need, h)
                    and (n := need.upper_bound(h.type, hs_of(h))) > 0]
            return min(mine)[3] if mine else None
        return got

    def _record(self, label: str, need: Need, placed_total: int, placed: int,
                domain: list[Host]) -> None:
        state = self.state
        # the whole cluster, every GPU of which the need may use: the state's totals
        whole = domain is state.cluster.hosts and self.may_use_all(need)
        free = 0 if not need.gpus else state.usable_total if whole else sum(
            (state.hosts[h.index].usable_gpus & need.eligible(h.type)).bit_count()
            for h in domain)
        p = self.progress
        if (placed_total, free) > (p.score, p.free_gpus):
            hosts = sum(not hs.drained for hs in state.hosts) if whole else sum(
                1 for h in domain if self.allowed(need, h)    # that it may use
                and not state.hosts[h.index].drained)
            self.progress = Progress(label, need.role, placed, need.replicas, free,
                                     hosts, placed_total)

    def may_use_all(self, need: Need) -> bool:
        """The need may use every GPU of every host (`allowed` everywhere, all eligible)."""
        return (self.only is None and not self.reg.filters and not need.mig and need.gpus > 0
                and all(need.eligible(t) == t.all_gpus and t.n_gpus >= need.gpus
                        for t in host_types(self.state.cluster)))

    def domains(self, tier: str) -> list[tuple[str, list[Host]]]:
        """Domains of a tier that could hold the job's GPUs: those with the least capable
        GPUs first, then the tightest."""
        c, s = self.state.cluster, self.state
        if tier == "nvlink_domain":
            return self.nvlink_domains()
        if tier == "switch":
            free, groups, name = s.switch_free, c.switches, lambda k: f"switch {k[1]}"
        elif tier == "rack":
            free, groups, name = s.rack_free, c.racks, lambda k: f"rack {k}"
        else:
            return [("the whole cluster", c.hosts)]
        keys = [k for k in groups if free[k] >= self.total_gpus]
        keys.sort(key=lambda k: (self.rank.of_domain(tier, k), free[k], str(k)))
        return [(name(k), groups[k]) for k in keys]

    def nvlink_domains(self) -> list[tuple[str, list[Host]]]:
        """Multi-node NVLink domains that could hold the job's GPUs, tightest first; under
        a hard `switch` or `rack` locality (a narrowed search), each domain's part under
        one switch or rack."""
        c, s = self.state.cluster, self.state
        hard = self.job.placement.locality
        out = []
        for key, hosts in c.nvlink_domains.items():
            if s.domain_free[key] < self.total_gpus:
                continue
            if hard in ("switch", "rack"):
                parts: dict = {}
                for h in hosts:
                    parts.setdefault(h.switch_key if hard == "switch" else h.rack, []).append(h)
                groups = list(parts.values())
            else:
                groups = [hosts]
            for g in groups:
                free = sum(s.hosts[h.index].usable_gpus.bit_count() for h in g)
                if free >= self.total_gpus:
                    out.append((free, key, g))
        out.sort(key=lambda x: (x[0], x[1]))
        return [(f"NVLink domain {key}", g) for _, key, g in out]
