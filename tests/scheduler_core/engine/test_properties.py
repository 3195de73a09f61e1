"""Property tests of the placement engine (hypothesis).

Random clusters of built-in DGX models and random job streams go through the real engine
(`planner.plan`, then `placement.place` + `state.commit` interleaved with `state.release`);
every test checks one invariant of the result after every step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import combinations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.engine.cluster import Cluster, ClusterFile, build_cluster
from airflow_gpu.scheduler_core.engine.hosttype import HostType, bits
from airflow_gpu.scheduler_core.engine.placement import Placed, Unplaced, place
from airflow_gpu.scheduler_core.engine.state import ClusterState, HostState, ReplicaAllocation
from airflow_gpu.scheduler_core.jobspec import JobSpec, Role
from airflow_gpu.scheduler_core.plugins import default_registry
from airflow_gpu.scheduler_core.policy.planner import PlanResult, plan

LOCALITIES = ("host", "switch", "rack", "any")
MODELS = ("dgx-1v", "dgx-2", "dgx-a100", "dgx-h100", "dgx-h200")
# Mixed case on purpose: model constraints match case-insensitively.
GPU_MODELS = ("A100", "H100", "V100", "H200", "a100", "h100", "v100")
GPU_MIN_MEMORY = ("16GiB", "40GiB", "48GiB", "80GiB")
# Small replicas often, so hosts fill up and jobs wait; big ones sometimes.
CPUS = st.one_of(st.integers(1, 8), st.integers(1, 64))
# Round sizes often (they collide with NUMA node capacities), odd ones sometimes.
MEMORY = st.one_of(
    st.sampled_from(["1GiB", "4GiB", "8GiB", "64GiB", "128GiB", "256GiB", "600GiB"]),
    st.integers(1, 32).map(lambda g: f"{g}GiB"),
    st.integers(1, 600).map(lambda g: f"{g}GiB"),
    st.integers(1, 600 * 1024).map(lambda m: f"{m}MiB"),
)

# Sized for the whole file to run in well under a minute on a slow 2-core machine.
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=_HEALTH)
# plan() alone (no release/place ops) is cheaper: search wider.
PLAN_SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=_HEALTH)


# -- strategies --------------------------------------------------------------------------
@st.composite
def cluster_files(draw: st.DrawFn, max_hosts: int = 12) -> dict:
    n_racks = draw(st.integers(1, 3))
    n_switches = draw(st.integers(1, 4))
    n_hosts = draw(st.integers(1, max_hosts))
    return {"cluster": "prop", "hosts": [
        {"name": f"h{i:02d}", "model": draw(st.sampled_from(MODELS)),
         "rack": f"rack-{draw(st.integers(1, n_racks))}",
         "switch": f"leaf-{draw(st.integers(1, n_switches))}"}
        for i in range(n_hosts)]}


@st.composite
def roles(draw: st.DrawFn, name: str) -> dict:
    role = {"name": name, "replicas": draw(st.integers(1, 4)),
            "gpus": draw(st.sampled_from([0, 1, 2, 3, 4, 8])),
            "cpus": draw(CPUS), "memory": draw(MEMORY)}
    gpu: dict = {}
    # each constraint on a quarter of the roles: with more, most jobs are simply rejected
    if draw(st.integers(0, 3)) == 0:
        gpu["model"] = draw(st.one_of(st.sampled_from(GPU_MODELS), st.lists(
            st.sampled_from(GPU_MODELS), min_size=1, max_size=2, unique=True)))
    if draw(st.integers(0, 3)) == 0:
        gpu["min_memory"] = draw(st.sampled_from(GPU_MIN_MEMORY))
    if gpu and role["gpus"]:          # a constraint on a role without GPUs is refused
        role["gpu"] = gpu
    return role


@st.composite
def jobs(draw: st.DrawFn, name: str) -> dict:
    n_roles = draw(st.integers(1, 3))
    return {
        "name": name,
        "priority": draw(st.integers(-100, 100)),
        "roles": [draw(roles(f"r{i}")) for i in range(n_roles)],
        "placement": {
            "pack": draw(st.booleans()),
            "locality": draw(st.sampled_from(LOCALITIES)),
            "affinity": draw(st.sampled_from(["strict", "preferred", "none"])),
        },
    }


@dataclass
class Scenario:
    cluster: dict
    jobs: list[dict]
    n_planned: int                     # jobs[:n_planned] go through plan(), the rest come later
    ops: list[tuple[str, int]]         # ("release" | "place", index)


@st.composite
def one_replica_jobs(draw: st.DrawFn, name: str, strict_gpu: bool = False) -> dict:
    """A one-replica job with cores / memory over the full range (`strict_gpu`: a GPU job
    with strict affinity)."""
    role = {"name": "r0", "gpus": draw(st.sampled_from([1, 2, 3, 4, 8] if strict_gpu
                                                        else [0, 1, 2, 3, 4, 8])),
            "cpus": draw(st.integers(1, 64)), "memory": draw(MEMORY)}
    # a model constraint often, so hosts with few cores per NUMA node are the only choice
    if draw(st.booleans()) and role["gpus"]:      # (refused on a role without GPUs)
        role["gpu"] = {"model": draw(st.sampled_from(GPU_MODELS))}
    affinity = "strict" if strict_gpu else draw(st.sampled_from(["strict", "preferred", "none"]))
    return {"name": name, "roles": [role],
            "placement": {"affinity": affinity, "locality": draw(st.sampled_from(LOCALITIES))}}


def strict_gpu_replicas(name: str) -> st.SearchStrategy[dict]:
    return one_replica_jobs(name, strict_gpu=True)


@st.composite
def cpu_jobs(draw: st.DrawFn, name: str) -> dict:
    """CPU-only work in NUMA-node-sized pieces: fills nodes while their GPUs stay free."""
    return {"name": name, "priority": draw(st.integers(-100, 100)), "roles": [
        {"name": "cpu", "replicas": draw(st.integers(1, 8)),
         "cpus": draw(st.sampled_from([8, 16, 24, 32, 48, 56, 64])), "memory": "1GiB"}]}


def busy_jobs(name: str) -> st.SearchStrategy[dict]:
    return st.one_of(jobs(name), cpu_jobs(name))


@st.composite
def scenarios(draw: st.DrawFn, with_ops: bool = True,
              job_strategy: Callable[[str], st.SearchStrategy[dict]] = jobs,
              max_hosts: int = 12) -> Scenario:
    cluster = draw(cluster_files(max_hosts))
    n_jobs = draw(st.integers(1, 12))
    specs = [draw(job_strategy(f"job{i}")) for i in range(n_jobs)]
    n_planned = draw(st.integers(1, n_jobs)) if with_ops else n_jobs
    ops = draw(st.lists(st.tuples(st.sampled_from(["release", "place"]),
                                  st.integers(0, n_jobs - 1)), max_size=16)) if with_ops else []
    return Scenario(cluster, specs, n_planned, ops)


# -- driving the engine ------------------------------------------------------------------
@dataclass
class Step:
    kind: str                              # plan | place | release
    state: ClusterState
    specs: dict[str, JobSpec]
    result: PlanResult | None = None       # for plan
    planned: tuple[str, ...] = ()          # for plan: the jobs it was given
    job: str = ""                          # for place / release
    outcome: Placed | Unplaced | None = None
    place_was_pure: bool = True            # place() left the state as it found it


def snapshot(state: ClusterState) -> tuple:
    """Everything observable about a state, comparable with ==."""
    hosts = tuple((hs.free_gpus, tuple(hs.free_cpus), tuple(hs.free_mem), hs.bad_gpus,
                   hs.drained) for hs in state.hosts)
    allocs = {job: [(a.role, a.index, a.host.index, a.gpu_mask, tuple(a.cpu_masks),
                     tuple(a.mem)) for a in allocs] for job, allocs in state.allocations.items()}
    return (hosts, [dict(b) for b in state.by_free], dict(state.switch_free),
            dict(state.rack_free), allocs)


def build(scn: Scenario) -> tuple[Cluster, dict[str, JobSpec]]:
    cluster = build_cluster(ClusterFile.model_validate(scn.cluster))
    specs = {j["name"]: JobSpec.model_validate(j) for j in scn.jobs}
    return cluster, specs


def replay(scn: Scenario) -> Iterator[Step]:
    """Plan the first jobs, then release / place as the ops say; yield after every step."""
    cluster, specs = build(scn)
    state = ClusterState(cluster)
    ordered = list(specs.values())
    result = plan(state, ordered[: scn.n_planned])
    yield Step("plan", state, specs, result=result,
               planned=tuple(j.name for j in ordered[: scn.n_planned]))
    reg = default_registry()
    for kind, i in scn.ops:
        if kind == "release":
            live = sorted(state.allocations)
            if not live:
                continue
            name = live[i % len(live)]
            state.release(name)
            yield Step("release", state, specs, job=name)
            continue
        job = ordered[i]
        if job.name in state.allocations:
            continue
        before = snapshot(state)
        got = place(job, state, reg)
        pure = snapshot(state) == before
        if isinstance(got, Placed):
            state.commit(job.name, got.allocations)
        yield Step("place", state, specs, job=job.name, outcome=got, place_was_pure=pure)


def live_allocations(state: ClusterState) -> Iterator[tuple[str, ReplicaAllocation]]:
    for job, allocs in state.allocations.items():
        for a in allocs:
            yield job, a


def cpu_mask(a: ReplicaAllocation) -> int:
    out = 0
    for _, m in a.cpu_masks:
        out |= m
    return out


# -- 1. nothing granted twice; free masks consistent; release restores -----------------------
def check_no_double_grant(state: ClusterState) -> None:
    cluster = state.cluster
    n = len(cluster.hosts)
    used_gpus, used_cpus = [0] * n, [0] * n
    used_mem = [[0] * len(h.type.numa_mem) for h in cluster.hosts]
    for job, a in live_allocations(state):
        h, t = a.host, a.host.type
        assert cluster.hosts[h.index] is h, f"{job}: allocation on a foreign host {h.name}"
        assert a.gpu_mask & ~t.all_gpus == 0, f"{job}: GPUs {a.gpus} not on {h.name}"
        assert used_gpus[h.index] & a.gpu_mask == 0, (
            f"{job}: GPUs {bits(used_gpus[h.index] & a.gpu_mask)} on {h.name} granted twice")
        used_gpus[h.index] |= a.gpu_mask
        for p, m in a.cpu_masks:
            # the reported NUMA position must really hold those CPUs
            assert m & ~t.numa_cpus[p] == 0, f"{job}: CPUs {bits(m)} not on NUMA pos {p}"
        mask = cpu_mask(a)
        assert mask.bit_count() == sum(m.bit_count() for _, m in a.cpu_masks), (
            f"{job}: a CPU listed twice in one replica: {a.cpu_masks}")
        assert used_cpus[h.index] & mask == 0, (
            f"{job}: CPUs {bits(used_cpus[h.index] & mask)} on {h.name} granted twice")
        used_cpus[h.index] |= mask
        for p, b in a.mem:
            assert b >= 0, f"{job}: negative memory grant {b} on NUMA pos {p}"
            used_mem[h.index][p] += b
    for h, hs in zip(cluster.hosts, state.hosts, strict=True):
        t = h.type
        assert hs.free_gpus == t.all_gpus & ~used_gpus[h.index], f"{h.name}: free GPUs drift"
        for p in range(len(t.numa_ids)):
            assert used_mem[h.index][p] <= t.numa_mem[p], (
                f"{h.name} NUMA pos {p}: {used_mem[h.index][p]} bytes granted of "
                f"{t.numa_mem[p]}")
            assert hs.free_cpus[p] == t.numa_cpus[p] & ~used_cpus[h.index], (
                f"{h.name} NUMA pos {p}: free CPUs drift")
            assert hs.free_mem[p] == t.numa_mem[p] - used_mem[h.index][p], (
                f"{h.name} NUMA pos {p}: free memory drift")
    # the per-bucket / per-domain indexes follow the free GPUs
    for h, hs in zip(cluster.hosts, state.hosts, strict=True):
        assert h.index in state.by_free[hs.usable_gpus.bit_count()], f"{h.name}: stale bucket"
    assert sum(len(b) for b in state.by_free) == n
    for key, hosts in cluster.switches.items():
        assert state.switch_free[key] == sum(
            state.hosts[h.index].usable_gpus.bit_count() for h in hosts), f"switch {key} drift"
    for key, hosts in cluster.racks.items():
        assert state.rack_free[key] == sum(
            state.hosts[h.index].usable_gpus.bit_count() for h in hosts), f"rack {key} drift"


@SETTINGS
@given(scenarios())
def test_no_gpu_cpu_or_numa_memory_granted_twice(scn: Scenario) -> None:
    state = None
    for step in replay(scn):
        check_no_double_grant(step.state)
        state = step.state
    assert state is not None
    for job in list(state.allocations):
        state.release(job)
        check_no_double_grant(state)
    # releasing everything gives back exactly the empty cluster
    assert snapshot(state) == snapshot(ClusterState(state.cluster))


# -- 2. gangs are all-or-nothing --------------------------------------------------------------
def core_size(t: HostType) -> int:
    """Threads per physical core of a host model (the built-ins are uniform)."""
    return max(c.bit_count() for cores in t.numa_cores for c in cores)


def threads_for(cpus: int, t: HostType) -> int:
    """Logical CPUs a replica asking `cpus` gets: whole cores (the default allocation)."""
    return -(-cpus // core_size(t)) * core_size(t)


def whole_core_threads(t: HostType, free: int) -> int:
    """Free logical CPUs that lie in fully free cores."""
    return sum(c.bit_count() for cores in t.numa_cores for c in cores if c & free == c)


def check_gang(job: JobSpec, allocs: list[ReplicaAllocation]) -> None:
    roles = {r.name: r for r in job.roles}
    assert len(allocs) == sum(r.replicas for r in job.roles), (
        f"{job.name}: {len(allocs)} replicas granted")
    indexes: dict[str, list[int]] = {r: [] for r in roles}
    for a in allocs:
        assert a.job == job.name
        role = roles[a.role]
        indexes[a.role].append(a.index)
        where = f"{job.name}/{a.role}[{a.index}]"
        assert a.gpu_mask.bit_count() == role.gpus, f"{where}: GPUs {a.gpus}"
        t = a.host.type
        assert len(a.cpus) == threads_for(role.cpus, t), (
            f"{where}: {len(a.cpus)} CPUs, wants {role.cpus} as whole cores")
        granted = sum(1 << c for c in a.cpus)
        assert all(c & granted in (0, c) for cores in t.numa_cores for c in cores), (
            f"{where}: CPUs {a.cpus} split a core")
        assert a.memory_bytes == role.memory, f"{where}: {a.memory_bytes} B, wants {role.memory}"
    for r in job.roles:
        assert sorted(indexes[r.name]) == list(range(r.replicas)), (
            f"{job.name}/{r.name}: replica indexes {sorted(indexes[r.name])}")


@SETTINGS
@given(scenarios())
def test_gangs_are_all_or_nothing(scn: Scenario) -> None:
    for step in replay(scn):
        state = step.state
        if step.kind == "plan":
            res = step.result
            assert res is not None
            admitted = [j.name for j, _ in res.admitted]
            waiting = [j.name for j, _ in res.pending] + [j.name for j, _ in res.rejected]
            # every job lands in exactly one list
            assert Counter(admitted + waiting) == Counter(step.planned)
            assert set(state.allocations) == set(admitted)
            for j, placed in res.admitted:
                assert state.allocations[j.name] == placed.allocations
            for name in waiting:
                assert name not in state.allocations, f"waiting job {name} holds resources"
        elif step.kind == "place":
            assert step.place_was_pure, f"place({step.job}) changed the state"
            placed = isinstance(step.outcome, Placed)
            assert (step.job in state.allocations) == placed
        else:
            assert step.job not in state.allocations
        for job, allocs in state.allocations.items():
            check_gang(step.specs[job], allocs)


# -- 3. locality --------------------------------------------------------------------------
@SETTINGS
@given(scenarios())
def test_locality_holds(scn: Scenario) -> None:
    for step in replay(scn):
        for job, allocs in step.state.allocations.items():
            locality = step.specs[job].placement.locality
            hosts = {a.host.name for a in allocs}
            switches = {a.host.switch_key for a in allocs}
            racks = {a.host.rack for a in allocs}
            if locality == "host":
                assert len(hosts) == 1, f"{job}: locality host, got hosts {sorted(hosts)}"
            elif locality == "switch":
                assert len(switches) == 1, f"{job}: locality switch, got {sorted(switches)}"
            elif locality == "rack":
                assert len(racks) == 1, f"{job}: locality rack, got racks {sorted(racks)}"


# -- 4. GPU model and memory constraints ----------------------------------------------------
@SETTINGS
@given(scenarios())
def test_gpu_constraints_hold(scn: Scenario) -> None:
    for step in replay(scn):
        for job, a in live_allocations(step.state):
            cons = {r.name: r.gpu for r in step.specs[job].roles}[a.role]
            t = a.host.type
            for g in a.gpus:
                name = t.gpu_name[g]
                if cons.model:
                    assert any(m.lower() in name.lower() for m in cons.model), (
                        f"{job}/{a.role}[{a.index}]: GPU {g} is {name!r}, wants {cons.model}")
                if cons.min_memory:
                    assert t.gpu_mem[g] >= cons.min_memory, (
                        f"{job}/{a.role}[{a.index}]: GPU {g} on {a.host.name} has "
                        f"{t.gpu_mem[g]} B, wants >= {cons.min_memory}")


# -- 5. strict affinity -------------------------------------------------------------------
def gpu_local(t: HostType, gpus: list[int]) -> tuple[set[int], int]:
    """NUMA positions of the GPUs, and the CPUs of those positions as a bitmask."""
    numas = {t.gpu_numa[g] for g in gpus}
    cpus = 0
    for p in numas:
        cpus |= t.numa_cpus[p]
    return numas, cpus


@SETTINGS
@given(scenarios())
def test_strict_affinity_keeps_cores_and_memory_local(scn: Scenario) -> None:
    for step in replay(scn):
        for job, a in live_allocations(step.state):
            if step.specs[job].placement.affinity != "strict" or not a.gpu_mask:
                continue
            numas, local_cpus = gpu_local(a.host.type, a.gpus)
            where = f"{job}/{a.role}[{a.index}] on {a.host.name} (GPUs {a.gpus})"
            # judged by CPU id, not by the NUMA position the engine reports
            assert cpu_mask(a) & ~local_cpus == 0, (
                f"{where}: CPUs {bits(cpu_mask(a) & ~local_cpus)} off the GPUs' NUMA nodes")
            remote = [(p, b) for p, b in a.mem if b and p not in numas]
            assert not remote, f"{where}: memory {remote} off NUMA positions {sorted(numas)}"


# -- 6. rejected never fits, pending fits the empty cluster -----------------------------------
def gpu_ok(role: Role, t: HostType, g: int) -> bool:
    cons = role.gpu
    return (not cons.model or any(m.lower() in t.gpu_name[g].lower() for m in cons.model)) \
        and t.gpu_mem[g] >= (cons.min_memory or 0)


def replica_fits(role: Role, t: HostType, hs: HostState, strict: bool) -> bool:
    """Whether one replica of `role` fits the host's free resources, by brute force.

    Without strict affinity cores and memory may come from any NUMA node, so sums decide.
    With it, try every set of NUMA nodes the replica's GPUs could span (at least one GPU on
    each): cores and memory may come from any node holding one of its GPUs.
    """
    numas = range(len(t.numa_ids))
    free = [sum(1 for g in range(t.n_gpus) if hs.usable_gpus >> g & 1 and t.gpu_numa[g] == p
                and gpu_ok(role, t, g)) for p in numas]
    # CPUs come as whole cores: only threads of fully free cores count
    cpus = [whole_core_threads(t, hs.free_cpus[p]) for p in numas]
    if not role.gpus or not strict:
        return (sum(free) >= role.gpus and sum(cpus) >= role.cpus
                and sum(hs.free_mem) >= role.memory)
    for size in range(1, min(role.gpus, len(t.numa_ids)) + 1):
        for nodes in combinations([p for p in numas if free[p]], size):
            if (sum(free[p] for p in nodes) >= role.gpus
                    and sum(cpus[p] for p in nodes) >= role.cpus
                    and sum(hs.free_mem[p] for p in nodes) >= role.memory):
                return True
    return False


def fits_empty_cluster_by_counts(job: JobSpec, cluster: Cluster) -> str | None:
    """Where the job surely fits the empty cluster, or None (also: cannot tell).

    Exact only without strict affinity: then cores and memory may come from any NUMA node,
    so plain sums decide. All GPUs of a built-in model are alike, so a role's constraint
    takes all or none of a host's GPUs.
    """
    if job.placement.affinity == "strict":
        return None
    for h in cluster.hosts:
        t = h.type
        if (all(gpu_ok(r, t, g) for r in job.roles if r.gpus for g in range(t.n_gpus))
                and sum(r.gpus * r.replicas for r in job.roles) <= t.n_gpus
                and sum(threads_for(r.cpus, t) * r.replicas for r in job.roles)
                <= t.total_cpus
                and sum(r.memory * r.replicas for r in job.roles) <= t.total_mem):
            return f"host {h.name}"
    if len(job.roles) > 1:
        return None
    # One role over several hosts: each host takes as many replicas as its sums allow.
    role = job.roles[0]

    def capacity(t: HostType) -> int:
        n = min(t.total_cpus // threads_for(role.cpus, t), t.total_mem // role.memory)
        if role.gpus:
            ok = all(gpu_ok(role, t, g) for g in range(t.n_gpus))
            n = min(n, t.n_gpus // role.gpus if ok else 0)
        return n

    domains = {"host": {h.name: [h] for h in cluster.hosts}, "switch": cluster.switches,
               "rack": cluster.racks, "any": {"cluster": cluster.hosts}}
    for key, hosts in domains[job.placement.locality].items():
        if sum(capacity(h.type) for h in hosts) >= role.replicas:
            return f"{job.placement.locality} {key}"
    return None


@PLAN_SETTINGS
@given(scenarios(with_ops=False))
def test_rejected_never_fits_and_pending_fits_empty_cluster(scn: Scenario) -> None:
    step = next(replay(scn))
    res = step.result
    assert res is not None
    cluster = step.state.cluster
    reg = default_registry()
    for job, error in res.rejected:
        got = place(job, ClusterState(cluster), reg)
        assert isinstance(got, Unplaced), f"{job.name} rejected ({error}) but fits when empty"
        where = fits_empty_cluster_by_counts(job, cluster)
        assert where is None, f"{job.name} rejected ({error}) but fits on {where}"
    for job, why in res.pending:
        got = place(job, ClusterState(cluster), reg)
        assert isinstance(got, Placed), f"{job.name} pending ({why.message}) but never fits"


def _one_strict_replica(model: str, gpus: int, cpus: int, memory: str) -> Scenario:
    return Scenario(
        cluster={"hosts": [{"name": "h00", "model": model}]},
        jobs=[{"name": "job0", "roles": [{"name": "r0", "gpus": gpus, "cpus": cpus,
                                          "memory": memory}],
               "placement": {"affinity": "strict"}}],
        n_planned=1, ops=[])


@PLAN_SETTINGS
@given(scenarios(with_ops=False, job_strategy=strict_gpu_replicas))
# Found by this test (since fixed): GPUs 0 and 2 of a DGX A100 sit on NUMA nodes 3 and 1,
# whose 64 cores hold the replica under strict affinity, yet the job was rejected.
@example(_one_strict_replica("dgx-a100", gpus=2, cpus=33, memory="1GiB"))
# Same on a DGX-2: 2 GPUs on both sockets have 1536 GiB local, one node 768 GiB.
@example(_one_strict_replica("dgx-2", gpus=2, cpus=1, memory="800GiB"))
def test_rejected_strict_replica_has_no_numa_local_fit(scn: Scenario) -> None:
    # Strict affinity allows any GPU set whose own NUMA nodes hold the cores and memory;
    # a one-replica job is rejected only if no such set exists on any host.
    step = next(replay(scn))
    assert step.result is not None
    for job, error in step.result.rejected:
        role = job.roles[0]
        if job.placement.affinity != "strict" or len(job.roles) > 1 or role.replicas > 1 \
                or not role.gpus:
            continue
        hosts = [h.name for h in step.state.cluster.hosts
                 if replica_fits(role, h.type, HostState.empty(h), strict=True)]
        assert not hosts, f"{job.name} rejected ({error}) but fits strictly on {hosts[0]}"


# -- 7. a one-replica job waits only if no host can hold it now --------------------------------
def _a100_trap(background: list[dict], gpus: int, cpus: int, memory: str
               ) -> tuple[Scenario, list[dict]]:
    probe = {"name": "train", "roles": [{"name": "w", "gpus": gpus, "cpus": cpus,
                                         "memory": memory}], "placement": {"affinity": "strict"}}
    return Scenario({"hosts": [{"name": "h00", "model": "dgx-a100"}]}, background,
                    len(background), []), [probe]


def _cpu_job(name: str, priority: int, replicas: int, cpus: int, memory: str) -> dict:
    return {"name": name, "priority": priority,
            "roles": [{"name": "cpu", "replicas": replicas, "cpus": cpus, "memory": memory}]}


@PLAN_SETTINGS
@given(scenarios(with_ops=False, job_strategy=busy_jobs, max_hosts=3),
       st.lists(one_replica_jobs("probe"), min_size=1, max_size=6))
# Found by this test. DGX A100, CPU-only work fills whole NUMA nodes 0, 2, 4, 6, 1, 3: GPUs 4
# and 6 (nodes 7 and 5) keep 64 free local cores, yet a strict 40-core replica waits.
@example(*_a100_trap([_cpu_job("etl", 0, 6, 32, "1GiB")], gpus=2, cpus=40, memory="1GiB"))
# The same for memory: nodes 1 and 3 keep their cores but no memory, nodes 5 and 7 keep
# 127 GiB each; a strict replica asking 200 GiB waits though GPUs 4 and 6 hold 254 GiB.
@example(*_a100_trap([_cpu_job("a", 3, 6, 1, "128GiB"), _cpu_job("b", 2, 1, 2, "1GiB"),
                      _cpu_job("c", 1, 1, 31, "1GiB")], gpus=2, cpus=2, memory="200GiB"))
def test_one_replica_job_waits_only_if_no_host_fits_now(scn: Scenario,
                                                        probes: list[dict]) -> None:
    step = next(replay(scn))
    state = step.state
    reg = default_registry()
    for spec in probes:
        job = JobSpec.model_validate(spec)
        got = place(job, state, reg)
        if isinstance(got, Placed):
            continue
        strict = job.placement.affinity == "strict"
        hosts = [h.name for h, hs in zip(state.cluster.hosts, state.hosts, strict=True)
                 if replica_fits(job.roles[0], h.type, hs, strict)]
        assert not hosts, f"{job.name} waits ({got.message}) but fits on {hosts[0]} now"
