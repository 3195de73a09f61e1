"""`placement.hosts`: the only hosts a job may use (what the local runner asks for: its
worker's host). A name the cluster lacks is refused at once, a job those hosts can never
hold is refused naming them, and jobs alike but for their hosts never share a verdict."""

from airflow_gpu.scheduler_core.engine.placement import Placed, never_fits, place
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.plugins import default_registry
from airflow_gpu.scheduler_core.policy.jobqueue import job_shape
from tests.helpers import job, make_state

REG = default_registry()


def cluster() -> ClusterState:
    return make_state({"name": "dgx-a-[01-02]", "model": "dgx-a100", "switch": "s1"},
                      {"name": "dgx-h-[01-02]", "model": "dgx-h100", "switch": "s2"})


def test_a_job_runs_only_on_the_hosts_it_names():
    state = cluster()
    for host in ("dgx-a-02", "dgx-h-01"):
        spec = job("j", {"name": "w", "replicas": 2, "gpus": 1}, placement={"hosts": host})
        got = place(spec, state, REG)
        assert isinstance(got, Placed)
        assert {a.host.name for a in got.allocations} == {host}


def test_a_name_the_cluster_lacks_is_refused_with_the_names_it_has():
    spec = job("j", {"name": "w", "gpus": 1}, placement={"hosts": ["dgx-a-01", "dgx-z-09"]})
    why = never_fits(spec, cluster(), REG)
    assert why == ("placement.hosts: 'dgx-z-09' is no host of the cluster 'test' (its "
                   "hosts: dgx-a-01, dgx-a-02, dgx-h-01, dgx-h-02); use the names of the "
                   "cluster file")


def test_a_job_its_hosts_can_never_hold_is_refused_naming_them():
    spec = job("j", {"name": "w", "replicas": 2, "gpus": 8}, placement={"hosts": "dgx-a-01"})
    why = never_fits(spec, cluster(), REG)
    assert why.startswith("the job does not fit even on the idle hosts of placement.hosts "
                          "(dgx-a-01): needs w 2x(8 GPUs"), why
    assert "add hosts to placement.hosts or shrink the job" in why
    big = job("j", {"name": "w", "gpus": 1, "gpu": {"min_memory": "80GiB"}},
              placement={"hosts": "dgx-a-01"})
    why = never_fits(big, cluster(), REG)
    assert "no host of placement.hosts (dgx-a-01) can hold a replica" in why, why
    assert never_fits(job("j", {"name": "w", "replicas": 2, "gpus": 8}), cluster(), REG) is None


def test_jobs_alike_but_for_their_hosts_have_different_shapes():
    one = job("j", {"name": "w", "gpus": 1}, placement={"hosts": "dgx-a-01"})
    two = job("j", {"name": "w", "gpus": 1}, placement={"hosts": "dgx-h-01"})
    assert job_shape(one) != job_shape(two) != job_shape(job("j", {"name": "w", "gpus": 1}))


def test_a_pending_reason_names_the_hosts_the_job_may_use():
    from airflow_gpu.scheduler_core.engine.placement import Unplaced

    state = cluster()
    first = place(job("a", {"name": "w", "gpus": 6}, placement={"hosts": "dgx-h-01"}),
                  state, REG)
    state.commit("a", first.allocations)
    got = place(job("b", {"name": "w", "gpus": 4}, placement={"hosts": "dgx-h-01"}),
                state, REG)
    assert isinstance(got, Unplaced)
    assert got.message.startswith("needs w 1x(4 GPUs"), got.message
    assert "on dgx-h-01 (placement.hosts); best host dgx-h-01 has 2 eligible GPUs" in \
        got.message, got.message
