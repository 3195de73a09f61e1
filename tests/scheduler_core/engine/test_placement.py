"""Placement rules on the real DGX topologies."""

import pytest

from airflow_gpu.scheduler_core.engine.hosttype import GiB, host_type
from airflow_gpu.scheduler_core.engine.placement import Placed, Unplaced, never_fits, place
from airflow_gpu.scheduler_core.engine.topology import Topology, load_topology
from airflow_gpu.scheduler_core.plugins import default_registry
from tests.helpers import admit, job, make_state

REG = default_registry()


def numa_cpus(model: str, numa_id: int) -> set[int]:
    return set(next(n for n in load_topology(model).host.numa_nodes if n.id == numa_id).cpus)


# -- GPUs within a host ------------------------------------------------------------------

def test_dgx1_four_gpus_get_a_fully_connected_quad():
    state = make_state({"name": "d1", "model": "dgx-1v"})
    (a,) = admit(state, job("quad", {"name": "w", "gpus": 4}))
    assert a.gpus in ([0, 1, 2, 3], [4, 5, 6, 7])
    t = a.host.type
    assert all(t.links[x][y] for x in a.gpus for y in a.gpus if x != y)
    (b,) = admit(state, job("quad2", {"name": "w", "gpus": 4}))
    assert sorted(a.gpus + b.gpus) == list(range(8))


def test_dgx1_two_gpus_get_an_nv2_pair_then_best_remaining():
    state = make_state({"name": "d1", "model": "dgx-1v"})
    t = state.cluster.hosts[0].type
    pairs = []
    for i in range(4):
        (a,) = admit(state, job(f"pair{i}", {"name": "w", "gpus": 2}))
        pairs.append(a.gpus)
    # The DGX-1V has NV2 pairs covering all 8 GPUs; every 2-GPU job gets one.
    assert all(t.links[p[0]][p[1]] == 2 for p in pairs), pairs
    assert sorted(g for p in pairs for g in p) == list(range(8))


def test_dgx1_pair_after_quad_is_taken_stays_in_the_broken_quad():
    state = make_state({"name": "d1", "model": "dgx-1v"})
    admit(state, job("one", {"name": "w", "gpus": 1}))      # GPU 0 from quad 0-3
    (a,) = admit(state, job("pair", {"name": "w", "gpus": 2}))
    assert a.host.type.links[a.gpus[0]][a.gpus[1]] == 2
    assert set(a.gpus) <= {1, 2, 3}, "the untouched quad 4-7 stays whole"
    (q,) = admit(state, job("quad", {"name": "w", "gpus": 4}))
    assert q.gpus == [4, 5, 6, 7]


def test_dgx_a100_pair_shares_a_pcie_switch_numa_node_and_nic():
    state = make_state({"name": "a", "model": "dgx-a100"})
    (a,) = admit(state, job("pair", {"name": "w", "gpus": 2, "cpus": 8, "memory": "32GiB"},
                            placement={"affinity": "strict"}))
    topo = load_topology("dgx-a100")
    g0, g1 = (topo.gpus[i] for i in a.gpus)
    assert g0.pcie_switch == g1.pcie_switch
    assert a.numa_nodes == [g0.numa_node]
    assert set(a.cpus) <= numa_cpus("dgx-a100", g0.numa_node) and len(a.cpus) == 8
    assert a.memory_bytes == 32 * GiB
    nics = {n.name for n in topo.nics if n.role == "compute" and n.pcie_switch == g0.pcie_switch}
    assert set(a.nics) == nics and nics


@pytest.mark.parametrize("model", ["dgx-a100", "dgx-a100-80gb"])
def test_dgx_a100_one_gpu_replicas_behind_one_switch_get_a_nic_each(model):
    """Each PCIe switch of a DGX A100 holds 2 GPUs and 2 compute HCAs (PXB to both, in
    the reference topology): two 1-GPU jobs there get one HCA each, not both the same."""
    state = make_state({"name": "a", "model": model})
    one = job("one", {"name": "w", "gpus": 1}, placement={"nics": True})
    a = admit(state, one)[0]
    b = admit(state, one.model_copy(update={"name": "two"}))[0]
    topo = load_topology(model)
    assert topo.gpus[a.gpus[0]].pcie_switch == topo.gpus[b.gpus[0]].pcie_switch
    assert (a.gpus, a.nics, b.gpus, b.nics) == ([0], ["mlx5_0"], [1], ["mlx5_1"])
    # a DGX-1 has one NIC per GPU pair: both GPUs of the pair share it
    dgx1 = make_state({"name": "d", "model": "dgx-1v"})
    c, d = (admit(dgx1, one.model_copy(update={"name": n}))[0] for n in ("c", "d"))
    assert c.nics == d.nics == ["mlx5_0"]


def test_nvswitch_models_prefer_switch_then_numa():
    state = make_state({"name": "h", "model": "dgx-h100"})
    (a,) = admit(state, job("four", {"name": "w", "gpus": 4}))
    topo = load_topology("dgx-h100")
    assert len({topo.gpus[i].numa_node for i in a.gpus}) == 1
    state2 = make_state({"name": "x", "model": "dgx-2"})
    (b,) = admit(state2, job("pair", {"name": "w", "gpus": 2}))
    topo2 = load_topology("dgx-2")
    assert len({topo2.gpus[i].pcie_switch for i in b.gpus}) == 1


def test_eight_gpus_on_a100_spread_cores_over_all_gpu_numa_nodes():
    state = make_state({"name": "a", "model": "dgx-a100"})
    (a,) = admit(state, job("full", {"name": "w", "gpus": 8, "cpus": 64, "memory": "64GiB"},
                            placement={"affinity": "strict"}))
    per_node = {n: len(set(a.cpus) & numa_cpus("dgx-a100", n)) for n in (1, 3, 5, 7)}
    assert per_node == {1: 16, 3: 16, 5: 16, 7: 16}


# -- CPU-GPU affinity --------------------------------------------------------------------

def test_strict_affinity_never_leaves_the_gpus_numa_node():
    state = make_state({"name": "a", "model": "dgx-a100"})
    # NUMA node 3 (GPUs 0,1) has 32 logical CPUs: two 1-GPU replicas of 16 fill it.
    for i in range(2):
        admit(state, job(f"j{i}", {"name": "w", "gpus": 1, "cpus": 16},
                         placement={"affinity": "strict"}))
    for i in range(6):
        (a,) = admit(state, job(f"k{i}", {"name": "w", "gpus": 1, "cpus": 4},
                                placement={"affinity": "strict"}))
        node = load_topology("dgx-a100").gpus[a.gpus[0]].numa_node
        assert set(a.cpus) <= numa_cpus("dgx-a100", node)


def test_strict_waits_where_preferred_falls_back():
    state = make_state({"name": "a", "model": "dgx-a100"})
    # Four 1-GPU jobs take every core of the GPU NUMA nodes 1, 3, 5, 7 (32 each).
    for i in range(4):
        admit(state, job(f"hog{i}", {"name": "w", "gpus": 1, "cpus": 32},
                         placement={"affinity": "strict"}))
    strict = job("s", {"name": "w", "gpus": 1, "cpus": 4}, placement={"affinity": "strict"})
    preferred = job("p", {"name": "w", "gpus": 1, "cpus": 4}, placement={"affinity": "preferred"})
    assert isinstance(place(strict, state, REG), Unplaced)
    (a,) = admit(state, preferred)
    gpu_node = load_topology("dgx-a100").gpus[a.gpus[0]].numa_node
    socket = {n.id: n.socket for n in load_topology("dgx-a100").host.numa_nodes}
    # the cores come from a GPU-less node of the GPU's own socket
    assert a.numa_nodes[0] in (0, 2, 4, 6) and socket[a.numa_nodes[0]] == socket[gpu_node]


def test_cpu_only_replicas_avoid_cores_next_to_free_gpus():
    state = make_state({"name": "a", "model": "dgx-a100"})
    (a,) = admit(state, job("etl", {"name": "e", "cpus": 16, "memory": "64GiB"}))
    # NUMA nodes 0, 2, 4, 6 of the DGX A100 have no GPUs.
    assert a.numa_nodes[0] in (0, 2, 4, 6)


def test_memory_is_never_overcommitted_on_a_numa_node():
    state = make_state({"name": "h", "model": "dgx-h100"})   # 2 NUMA nodes x 1 TiB
    admit(state, job("a", {"name": "w", "gpus": 4, "memory": "900GiB"},
                     placement={"affinity": "strict"}))
    admit(state, job("b", {"name": "w", "gpus": 4, "memory": "900GiB"},
                     placement={"affinity": "strict"}))
    big = job("c", {"name": "w", "gpus": 0, "cpus": 1, "memory": "300GiB"})
    assert isinstance(place(big, state, REG), Unplaced)
    assert all(m >= 0 for m in state.hosts[0].free_mem)


# -- gangs across hosts ------------------------------------------------------------------

MIXED = [
    {"name": "dgx-a-[01-04]", "model": "dgx-a100", "rack": "r1", "switch": "leaf-1"},
    {"name": "dgx-h-[01-02]", "model": "dgx-h100", "rack": "r1", "switch": "leaf-2"},
    {"name": "dgx-h-[03-05]", "model": "dgx-h100", "rack": "r2", "switch": "leaf-3"},
    {"name": "dgx-a-[05-08]", "model": "dgx-a100", "rack": "r2", "switch": "leaf-4"},
]


def brief_job(**placement):
    return job("imagenet-tf",
               {"name": "ps", "replicas": 2, "cpus": 1, "memory": "8GiB"},
               {"name": "worker", "replicas": 10, "gpus": 1, "gpu": {"min_memory": "48GiB"},
                "cpus": 4, "memory": "5GiB"},
               placement={"pack": True, "locality": "switch", "affinity": "strict", **placement})


def test_product_brief_two_ps_and_ten_workers():
    state = make_state(*MIXED)
    allocs = admit(state, brief_job())
    workers = [a for a in allocs if a.role == "worker"]
    ps = [a for a in allocs if a.role == "ps"]
    assert len(workers) == 10 and len(ps) == 2
    # only H100s have >= 48 GiB; 10 GPUs need at least 2 hosts, and use exactly 2
    assert {a.host.type.model for a in workers} == {"dgx-h100"}
    worker_hosts = {a.host.name for a in workers}
    assert len(worker_hosts) == 2
    assert len({a.host.switch_key for a in allocs}) == 1
    # parameter servers sit on the workers' hosts, 1 CPU (so one whole core: both of its
    # threads, i and i + 112 on a DGX H100) and 8 GiB each
    assert {a.host.name for a in ps} <= worker_hosts
    assert all(len(a.cpus) == 2 and a.cpus[1] == a.cpus[0] + 112
               and a.memory_bytes == 8 * GiB for a in ps)
    for a in workers:  # cores and memory on the GPU's NUMA node, NIC behind the GPU
        gpu = load_topology("dgx-h100").gpus[a.gpus[0]]
        assert set(a.cpus) <= numa_cpus("dgx-h100", gpu.numa_node) and len(a.cpus) == 4
        assert a.numa_nodes == [gpu.numa_node] and a.memory_bytes == 5 * GiB
        assert a.nics == load_topology("dgx-h100").gpu_local_nics(gpu.index)
    # no GPU or core granted twice
    seen = [(a.host.name, g) for a in allocs for g in a.gpus]
    assert len(seen) == len(set(seen))
    cores = [(a.host.name, c) for a in allocs for c in a.cpus]
    assert len(cores) == len(set(cores))


def test_replicas_get_whole_cores_unless_threads_are_asked_for():
    """No job gets the SMT sibling of another job's core: CPUs go by whole physical cores
    (CPU i and i + 128 on a DGX A100), a replica asking 3 gets 2 cores."""
    state = make_state({"name": "h1", "model": "dgx-a100"})
    a, b = (admit(state, job(n, {"name": "w", "cpus": 1}))[0] for n in ("a", "b"))
    assert a.cpus == [a.cpus[0], a.cpus[0] + 128] and len(b.cpus) == 2
    assert not set(a.cpus) & set(b.cpus)
    (c,) = admit(state, job("c", {"name": "w", "gpus": 1, "cpus": 3}))
    assert len(c.cpus) == 4 and {x % 128 for x in c.cpus} == {c.cpus[0], c.cpus[1]}
    threads = job("t", {"name": "w", "cpus": 3}, placement={"cpu_allocation": "thread"})
    (t,) = admit(state, threads)
    assert len(t.cpus) == 3
    # a model whose thread numbering is not the usual one says so, and is followed
    topo = load_topology("dgx-a100").model_dump(by_alias=True)
    topo["host"]["thread_siblings"] = [f"{k},{k + 16}" for k in range(16)]
    with pytest.raises(ValueError, match="different NUMA nodes"):
        Topology.model_validate(topo)     # CPUs 0 and 16 are on NUMA nodes 0 and 1
    topo["host"]["thread_siblings"] = [f"{2 * k},{2 * k + 1}" for k in range(128)]
    pairs = Topology.model_validate(topo)
    assert pairs.host.cores()[:2] == [[0, 1], [2, 3]]
    other = make_state({"name": "h2", "model": "dgx-a100"})
    other.hosts[0].free_cpus[:] = list(host_type(pairs).numa_cpus)
    assert host_type(pairs).numa_cores[0][:2] == (0b11, 0b1100)


def test_brief_job_is_pending_with_locality_reason_when_no_switch_can_hold_it():
    state = make_state(*MIXED)
    # 6 GPUs held on every H100 host: 10 H100 GPUs free in all, 4 or 6 per switch
    for h in ("dgx-h-01", "dgx-h-02", "dgx-h-03", "dgx-h-04", "dgx-h-05"):
        got = place(job(f"hold-{h}", {"name": "w", "gpus": 6, "gpu": {"model": "H100"}}),
                    state, REG)
        assert isinstance(got, Placed)
        state.commit(f"hold-{h}", got.allocations)
    got = place(brief_job(), state, REG)
    assert isinstance(got, Unplaced)
    assert got.code == "Locality"  # 10 H100 GPUs free in all, but only 4 or 6 per switch
    assert "10x(1 GPU [>=48GiB]" in got.message and "held by hold-" in got.message
    state.release("hold-dgx-h-01")
    got = place(brief_job(), state, REG)
    assert isinstance(got, Placed)
    state.commit("imagenet-tf", got.allocations)
    got = place(brief_job().model_copy(update={"name": "second"}), state, REG)
    assert isinstance(got, Unplaced) and got.code == "Resources"  # 4 H100 GPUs left in all


def test_locality_code_when_enough_gpus_are_free_only_across_switches():
    state = make_state(*MIXED)
    for i in range(3):  # 5 GPUs on each of dgx-h-01, -02, -03
        got = place(job(f"hold-{i}", {"name": "w", "gpus": 5, "gpu": {"model": "H100"}}),
                    state, REG)
        state.commit(f"hold-{i}", got.allocations)
    # leaf-2: 3 + 3 free; leaf-3: 3 + 8 + 8 = 19 -> a 20-GPU gang fits only across switches
    big = job("big", {"name": "w", "replicas": 20, "gpus": 1, "gpu": {"model": "H100"}},
              placement={"locality": "switch"})
    got = place(big, state, REG)
    assert isinstance(got, Unplaced) and got.code == "Locality"
    assert "under one switch" in got.message
    assert isinstance(place(big.model_copy(update={"placement": big.placement.model_copy(
        update={"locality": "any"})}), state, REG), Placed)


def test_concentration_uses_fewest_hosts_then_one_switch():
    state = make_state(*MIXED)
    allocs = admit(state, job("w12", {"name": "w", "replicas": 12, "gpus": 1,
                                      "gpu": {"model": "A100"}}))
    assert len({a.host.name for a in allocs}) == 2
    assert len({a.host.switch_key for a in allocs}) == 1


def test_tight_fit_keeps_whole_hosts_free():
    state = make_state({"name": "h-[1-3]", "model": "dgx-h100", "switch": "s"})
    admit(state, job("six", {"name": "w", "gpus": 6}))                 # h-1 has 2 left
    (a,) = admit(state, job("two", {"name": "w", "gpus": 2}))
    assert a.host.name == "h-1"
    (b,) = admit(state, job("eight", {"name": "w", "gpus": 8}))
    assert b.host.name in ("h-2", "h-3")
    ten = place(job("ten", {"name": "w", "replicas": 10, "gpus": 1}), state, REG)
    assert isinstance(ten, Unplaced)  # 8 left on the last host: cannot hold 10


def test_gang_is_all_or_nothing():
    state = make_state({"name": "h-[1-2]", "model": "dgx-h100"})
    before = [(hs.free_gpus, list(hs.free_cpus), list(hs.free_mem)) for hs in state.hosts]
    got = place(job("too-big", {"name": "w", "replicas": 3, "gpus": 8}), state, REG)
    assert isinstance(got, Unplaced)
    after = [(hs.free_gpus, list(hs.free_cpus), list(hs.free_mem)) for hs in state.hosts]
    assert before == after and not state.allocations


def test_pack_false_spreads_replicas():
    state = make_state({"name": "h-[1-4]", "model": "dgx-h100"})
    allocs = admit(state, job("spread", {"name": "w", "replicas": 4, "gpus": 1},
                              placement={"pack": False}))
    assert len({a.host.name for a in allocs}) == 4


def test_cpu_roles_go_to_the_switch_of_the_workers_when_their_hosts_are_full():
    state = make_state({"name": "h-[1-2]", "model": "dgx-h100", "rack": "r", "switch": "s1"},
                       {"name": "h-[3-4]", "model": "dgx-h100", "rack": "r", "switch": "s2"})
    spec = job("tf", {"name": "ps", "replicas": 1, "cpus": 8},
               {"name": "worker", "replicas": 2, "gpus": 8, "cpus": 112},
               placement={"locality": "rack"})
    allocs = admit(state, spec)
    worker_switches = {a.host.switch_key for a in allocs if a.role == "worker"}
    ps = [a for a in allocs if a.role == "ps"][0]
    assert ps.host.switch_key in worker_switches


def test_drained_and_unhealthy_parts_get_no_work():
    state = make_state({"name": "h-[1-2]", "model": "dgx-h100"})
    state.set_drained("h-1")
    state.set_unhealthy_gpus("h-2", [0, 1])
    allocs = admit(state, job("six", {"name": "w", "gpus": 6}))
    assert allocs[0].host.name == "h-2" and not {0, 1} & set(allocs[0].gpus)
    assert isinstance(place(job("one", {"name": "w", "gpus": 1}), state, REG), Unplaced)


# -- never fits ---------------------------------------------------------------------------

def test_rejection_names_the_constraint():
    state = make_state(*MIXED)
    empty = state.empty_like()
    cases = [
        (job("b200", {"name": "w", "gpus": 1, "gpu": {"model": "B200"}}), "model ['B200']"),
        (job("mem", {"name": "w", "gpus": 1, "gpu": {"min_memory": "100GiB"}}),
         "min_memory 100GiB"),
        (job("wide", {"name": "w", "gpus": 16}), "asks 16 GPUs per replica"),
        (job("cores", {"name": "w", "gpus": 1, "cpus": 200}, placement={"affinity": "strict"}),
         "placement.affinity 'strict'"),
        (job("huge", {"name": "w", "cpus": 1000}), "one replica needs 1000 CPUs"),
        (job("switch", {"name": "w", "replicas": 5, "gpus": 8, "gpu": {"model": "H100"}},
             placement={"locality": "switch"}), "must fit one switch"),
        (job("host", {"name": "w", "replicas": 2, "gpus": 8}, placement={"locality": "host"}),
         "fit one host"),
    ]
    for spec, text in cases:
        why = never_fits(spec, empty, REG)
        assert why is not None and text in why, (spec.name, why)
    assert never_fits(brief_job(), empty, REG) is None


def test_same_state_same_choice_whatever_the_history():
    """Hosts re-enter the free-GPU index in another order after a release and re-commit;
    the choice must depend on the state only (reservation walks rely on this)."""
    state = make_state({"name": "h[1-6]", "model": "dgx-a100"})
    for i in range(6):
        admit(state, job(f"six{i}", {"name": "w", "gpus": 6}))
    first = place(job("two", {"name": "w", "gpus": 2}), state, REG)
    for i in (4, 0, 2):
        allocs = state.release(f"six{i}")
        state.commit(f"six{i}", allocs)
    again = place(job("two", {"name": "w", "gpus": 2}), state, REG)
    assert [(a.host.name, a.gpus) for a in again.allocations] == [
        (a.host.name, a.gpus) for a in first.allocations] == [("h1", [6, 7])]
