"""Pending and rejection reasons name only what the job could use: the jobs holding GPUs
on hosts it may run on, the eligible GPUs and hosts it could have, the drained hosts that
would take part of it, and the host that really is the largest. Clusters from the real
host models."""

from airflow_gpu.scheduler_core.engine.cluster import load_cluster
from airflow_gpu.scheduler_core.engine.placement import Placed, Unplaced, never_fits, place
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.plugins import default_registry
from airflow_gpu.scheduler_core.policy.planner import plan
from tests.helpers import admit, job, make_state

REG = default_registry()


def four_h100() -> ClusterState:
    return make_state({"name": "h-[01-04]", "model": "dgx-h100", "switch": "s1"})


def test_a_pinned_job_names_only_the_jobs_and_gpus_of_its_host():
    """Pinned to h-01: the jobs on h-02 and h-03 hold nothing it could use, and the 20
    GPUs free elsewhere are not its to have."""
    state = four_h100()
    for name, host, gpus in (("on-h01", "h-01", 6), ("on-h02", "h-02", 5), ("on-h03", "h-03", 1)):
        admit(state, job(name, {"name": "w", "gpus": gpus}, placement={"hosts": host}))
    got = place(job("pinned", {"name": "w", "gpus": 4}, placement={"hosts": "h-01"}),
                state, REG)
    assert isinstance(got, Unplaced)
    assert "; its host has 2 eligible GPUs free; held by on-h01 (6)" in got.message, got.message
    assert got.details["held_by"] == {"on-h01": 6} and got.details["cluster_free_gpus"] == 2
    # unpinned, it fits; a job asking H100s on a mixed cluster counts H100 holders only
    assert isinstance(place(job("free", {"name": "w", "gpus": 4}), state, REG), Placed)
    mixed = make_state({"name": "a-01", "model": "dgx-a100"}, {"name": "h-01", "model": "dgx-h100"})
    admit(mixed, job("a100s", {"name": "w", "gpus": 8}, placement={"hosts": "a-01"}))
    admit(mixed, job("h100s", {"name": "w", "gpus": 7}, placement={"hosts": "h-01"}))
    got = place(job("two", {"name": "w", "gpus": 2, "gpu": {"model": "H100"}}), mixed, REG)
    assert got.details["held_by"] == {"h100s": 7}
    assert "the cluster has 1 eligible GPUs free; held by h100s (7)" in got.message


def test_host_counts_count_the_hosts_the_job_could_use():
    """One switch of 2 DGX A100 and 2 DGX H100 hosts: a gang of H100 replicas has 2 hosts
    there, not 4."""
    state = make_state({"name": "a-[01-02]", "model": "dgx-a100", "switch": "s1"},
                       {"name": "h-[01-02]", "model": "dgx-h100", "switch": "s1"})
    three = job("three", {"name": "w", "replicas": 3, "gpus": 8, "gpu": {"model": "H100"}},
                placement={"locality": "switch"})
    why = never_fits(three, state.empty_like(), REG)
    assert "the largest, s1, has 16 eligible GPUs on 2 hosts" in why, why
    admit(state, job("busy", {"name": "w", "gpus": 1}, placement={"hosts": "h-01"}))
    two = job("two", {"name": "w", "replicas": 2, "gpus": 8, "gpu": {"model": "H100"}},
              placement={"locality": "switch"})
    got = place(two, state, REG)
    assert isinstance(got, Unplaced)
    assert "(15 eligible GPUs free on 2 hosts)" in got.message, got.message
    bigger = job("big", {"name": "w", "replicas": 5, "gpus": 8, "gpu": {"model": "H100"}})
    assert never_fits(bigger, state.empty_like(), REG).endswith(
        "the cluster has 16 eligible GPUs on 2 hosts")


def test_a_drained_host_that_would_hold_part_of_a_gang_says_how_much():
    """h-03 drained, h-01 and h-02 busy: a 16-GPU gang fits now only with h-03's 8 GPUs
    and h-04's, not "16 GPUs fit now only on drained hosts h-03" (an 8-GPU host)."""
    state = four_h100()
    for host in ("h-01", "h-02"):
        admit(state, job(f"on-{host}", {"name": "w", "gpus": 8}, placement={"hosts": host}))
    state.set_drained("h-03")
    state.drain_reasons["h-03"] = "bad fan"
    out = plan(state, [job("gang", {"name": "w", "replicas": 2, "gpus": 8})])
    ((_, why),) = out.pending
    assert ("it fits now only with drained hosts h-03 (reason: bad fan), which would hold 8 "
            "of its 16 GPUs") in why.message, why.message
    assert "16 GPUs fit now only" not in why.message
    assert why.details["drained_hosts"] == {"h-03": "bad fan"}
    # all of it on drained hosts: said as before
    out = plan(state, [job("eight", {"name": "w", "gpus": 8, "cpus": 8}, placement={
        "hosts": ["h-01", "h-03"]})])
    ((_, why),) = out.pending
    assert "8 GPUs fit now only on drained hosts h-03 (reason: bad fan)" in why.message


def test_a_rejection_names_the_host_that_really_is_the_largest():
    """On the example cluster the DGX A100 has the most CPUs (256) but the H100s and H200s
    the most memory (2 TiB): a replica asking 3 TiB is refused naming a 2 TiB host."""
    empty = ClusterState(load_cluster("example"))
    mem = never_fits(job("j", {"name": "w", "memory": "3TiB"}), empty, REG)
    assert mem == ("role 'w': one replica needs 1 CPU and 3TiB but the host with the most "
                   "memory, dgx-h-01 (dgx-h100), has 224 CPUs and 2TiB"), mem
    cpus = never_fits(job("j", {"name": "w", "cpus": 1000, "memory": "1GiB"}), empty, REG)
    assert cpus.endswith("the host with the most CPUs, dgx-a-01 (dgx-a100), has 256 CPUs "
                         "and 1TiB"), cpus
    both = never_fits(job("j", {"name": "w", "cpus": 250, "memory": "1.5TiB"}), empty, REG)
    assert both.endswith("no host has both: dgx-a-01 (dgx-a100) has 256 CPUs and 1TiB; "
                         "dgx-h-01 (dgx-h100) has 224 CPUs and 2TiB"), both
    wide = never_fits(job("j", {"name": "w", "gpus": 32}), empty, REG)
    assert "the largest host, dgx-2-01 (dgx-2), has 16 such GPUs" in wide, wide


def test_a_job_kept_off_a_maintenance_window_expects_its_hosts_back_at_its_end():
    """One host in a window from 1 h to 3 h, the other busy for 12 h: a 12-hour job
    expects to start when the window ends (3 h), not when the busy job ends (12 h)."""
    from airflow_gpu.scheduler_core.policy.windows import Window

    state = make_state({"name": "a-[01-02]", "model": "dgx-a100", "switch": "s1"})
    window = Window("fw", ("a-01",), 3600.0, 3 * 3600.0, maint=True)
    out = plan(state, [job(name, {"name": "w", "gpus": 8}, expected_runtime=runtime)
                       for name, runtime in (("busy", "12h"), ("long", "12h"))],
               windows=[window])
    started = {spec.name: placed.allocations[0].host.name for spec, placed in out.admitted}
    assert started == {"busy": "a-02"}
    ((spec, why),) = out.pending
    assert (spec.name, why.code) == ("long", "ReservedForMaintenance"), why
    assert why.eta == 3 * 3600.0, why
