"""Placements that leave room: spread jobs use every host before doubling up, and jobs
take the least capable GPUs that fit, so the GPUs only some jobs can use stay free.
Clusters from the real host models (and the built-in example cluster)."""

from airflow_gpu.scheduler_core.engine.cluster import load_cluster
from airflow_gpu.scheduler_core.engine.placement import Placed, Unplaced, place
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.jobclasses import BUILTIN, resolve
from airflow_gpu.scheduler_core.plugins import default_registry
from tests.helpers import admit, job, make_state

REG = default_registry()


def hosts_of(allocs) -> list[str]:
    return [a.host.name for a in allocs]


def two_switches() -> ClusterState:
    return make_state({"name": "h-[01-02]", "model": "dgx-h100", "switch": "s1"},
                      {"name": "h-[03-04]", "model": "dgx-h100", "switch": "s2"})


# -- spread ------------------------------------------------------------------------------

def test_spread_jobs_put_one_replica_on_each_host_before_doubling_up():
    """4 H100 hosts under 2 switches: a spread ETL job (its class) and a spread GPU job
    each put one replica on every host, not h-01, h-02, h-01, h-01."""
    state = two_switches()
    etl = resolve(job("etl", {"name": "spark", "replicas": 4, "cpus": 8, "memory": "16GiB"},
                      job_class="etl"), {c.name: c for c in BUILTIN})
    assert etl.placement.pack is False
    assert sorted(hosts_of(admit(state, etl))) == ["h-01", "h-02", "h-03", "h-04"]
    gpu = job("gpu", {"name": "w", "replicas": 4, "gpus": 1}, placement={"pack": False})
    assert sorted(hosts_of(admit(state, gpu))) == ["h-01", "h-02", "h-03", "h-04"]


def test_spread_then_the_least_loaded_host():
    state = two_switches()
    seven = job("seven", {"name": "w", "replicas": 7, "gpus": 1}, placement={"pack": False})
    placed = hosts_of(admit(state, seven))
    assert sorted(placed[:4]) == ["h-01", "h-02", "h-03", "h-04"]
    assert sorted(placed.count(h) for h in set(placed)) == [1, 2, 2, 2]
    # under a hard switch locality it spreads over that switch's hosts only
    state = two_switches()
    four = job("four", {"name": "w", "replicas": 4, "gpus": 1},
               placement={"pack": False, "locality": "switch"})
    placed = hosts_of(admit(state, four))
    assert len(set(placed)) == 2 and placed.count(placed[0]) == 2
    # the least loaded: a host the job has fewer replicas on, then the roomiest
    state = two_switches()
    admit(state, job("busy", {"name": "w", "gpus": 7}, placement={"hosts": "h-03"}))
    five = job("five", {"name": "w", "replicas": 5, "gpus": 1}, placement={"pack": False})
    placed = hosts_of(admit(state, five))
    assert placed.count("h-03") == 1 and len(set(placed)) == 4


def test_a_spread_job_on_one_host_per_replica_stays_within_one_switch_when_it_can():
    """Distinct hosts first; with as many hosts in one switch, that switch (tier 1)."""
    state = make_state({"name": "h-[01-03]", "model": "dgx-h100", "switch": "s1"},
                       {"name": "h-[04-06]", "model": "dgx-h100", "switch": "s2"})
    got = place(job("three", {"name": "w", "replicas": 3, "gpus": 2},
                    placement={"pack": False}), state, REG)
    assert isinstance(got, Placed) and len(got.hosts) == 3 and got.tier == 1


# -- least capable GPUs first ------------------------------------------------------------

def test_a_48gib_gang_leaves_the_h200s_to_a_job_only_they_can_hold():
    """On the example cluster a 16-GPU job asking >= 48 GiB once took both H200 hosts;
    a later job asking >= 100 GiB then waited while the H100 hosts sat idle."""
    state = ClusterState(load_cluster("example"))
    mid = job("mid", {"name": "w", "replicas": 2, "gpus": 8, "gpu": {"min_memory": "48GiB"}})
    assert {a.host.type.model for a in admit(state, mid)} == {"dgx-h100"}
    big = job("big", {"name": "w", "replicas": 2, "gpus": 8, "gpu": {"min_memory": "100GiB"}})
    assert sorted(hosts_of(admit(state, big))) == ["dgx-h200-01", "dgx-h200-02"]


def test_least_capable_first_over_tight_fit_for_one_host():
    state = ClusterState(load_cluster("example"))
    # one H200 GPU busy: tight fit alone would put the next >=48GiB job beside it
    admit(state, job("on-h200", {"name": "w", "gpus": 1}, placement={"hosts": "dgx-h200-01"}))
    (a,) = admit(state, job("one", {"name": "w", "gpus": 1, "gpu": {"min_memory": "48GiB"}}))
    assert a.host.type.model == "dgx-h100"
    # no constraint: the least memory (V100 16GB: a DGX-1), then the oldest NVLink
    (b,) = admit(state, job("any", {"name": "w", "gpus": 2}))
    assert b.host.type.model == "dgx-1v"
    # 32 GiB: a DGX-2's V100 32GB before any A100 40GB
    (c,) = admit(state, job("v32", {"name": "w", "gpus": 1, "gpu": {"min_memory": "32GiB"}}))
    assert c.host.type.model == "dgx-2"


def test_equal_memory_the_older_generation_goes_first():
    state = make_state({"name": "h-01", "model": "dgx-h100"},
                       {"name": "a-01", "model": "dgx-a100-80gb"})
    (a,) = admit(state, job("one", {"name": "w", "gpus": 1}))
    assert a.host.name == "a-01"           # both 80 GB: A100 (NVLink 3) before H100 (4)


def test_a_job_that_names_a_model_or_host_keeps_its_choice():
    state = ClusterState(load_cluster("example"))
    admit(state, job("on-h200", {"name": "w", "gpus": 1}, placement={"hosts": "dgx-h200-01"}))
    # naming the models: tight fit among them, as before (the busy H200 host)
    (a,) = admit(state, job("named", {"name": "w", "gpus": 1,
                                      "gpu": {"model": ["H100", "H200"]}}))
    assert a.host.name == "dgx-h200-01"
    (b,) = admit(state, job("pinned", {"name": "w", "gpus": 1},
                            placement={"hosts": ["dgx-h-01", "dgx-h200-02"]}))
    assert b.host.name == "dgx-h-01"


def test_when_the_least_capable_gpus_are_busy_the_next_ones_go():
    state = ClusterState(load_cluster("example"))
    admit(state, job("v100s", {"name": "w", "replicas": 4, "gpus": 8, "gpu": {"model": "V100"}}))
    got = place(job("any16", {"name": "w", "gpus": 16}), state, REG)
    assert isinstance(got, Unplaced)           # the DGX-2 is taken: no host has 16
    (a,) = admit(state, job("any8", {"name": "w", "gpus": 8}))
    assert a.host.type.model == "dgx-a100"     # V100s all busy: A100 40GB next
