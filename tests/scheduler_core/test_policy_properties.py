"""Property tests of the queue policy (hypothesis): random small clusters and traces
replayed through the real scheduler with exact runtimes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.cluster import Cluster
from airflow_gpu.scheduler_core.jobqueue import JobQueue
from airflow_gpu.scheduler_core.policy import PolicyConfig
from airflow_gpu.scheduler_core.scheduler import PassResult, Scheduler
from airflow_gpu.scheduler_core.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.state import ClusterState
from airflow_gpu.scheduler_core.trace import TraceJob
from tests.helpers import job, make_cluster

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MODELS = ("dgx-1v", "dgx-a100", "dgx-2")


@st.composite
def cluster_hosts(draw) -> tuple[dict, ...]:
    n = draw(st.integers(1, 4))
    return tuple({"name": f"h{i}", "model": draw(st.sampled_from(MODELS)),
                  "switch": f"s{draw(st.integers(1, 2))}"} for i in range(n))


def clusters() -> st.SearchStrategy[Cluster]:
    # hosts are drawn as plain dicts, so a failing example prints readably
    return cluster_hosts().map(lambda hosts: _Named(make_cluster(*hosts), hosts))


class _Named(Cluster):
    def __init__(self, cluster: Cluster, hosts: tuple[dict, ...]):
        super().__init__(cluster.name, cluster.hosts)
        self._hosts = hosts

    def __repr__(self) -> str:
        return f"cluster{self._hosts!r}"


@st.composite
def traces(draw) -> list[TraceJob]:
    n = draw(st.integers(2, 14))
    return [TraceJob(f"j{i}", draw(st.integers(0, 400)), draw(st.integers(1, 1000)),
                     draw(st.sampled_from((1, 1, 2, 4, 8, 8, 16, 24))), line=i + 2)
            for i in range(n)]


def replay(cluster: Cluster, trace: list[TraceJob], mode: str, observe=None) -> dict:
    # one team, equal priorities: the order is arrival order in every policy
    options = SimOptions(PolicyConfig(mode=mode, fairshare_weight=0), (1.0, 1.0, 1.0))
    res = simulate(cluster, trace, options, observe=observe)
    return {r.job_id: r for r in res.records}


def check_state(s: Scheduler, _: PassResult) -> None:
    """After every pass the state holds exactly the running jobs: holds and trial
    releases are undone, and no GPU, core or byte is held twice."""
    fresh = ClusterState(s.state.cluster)
    for name, allocs in s.state.allocations.items():
        for a in allocs:
            hs = fresh.hosts[a.host.index]
            assert a.gpu_mask & ~hs.free_gpus == 0, f"{name}: GPU held twice"
            for p, m in a.cpu_masks:
                assert m & ~hs.free_cpus[p] == 0, f"{name}: CPU held twice"
        fresh.commit(name, allocs)
    for mine, want in zip(s.state.hosts, fresh.hosts, strict=True):
        assert (mine.free_gpus, mine.free_cpus, mine.free_mem) == (
            want.free_gpus, want.free_cpus, want.free_mem)
    assert s.state.usable_total == fresh.usable_total
    assert all(m >= 0 for hs in s.state.hosts for m in hs.free_mem)


@SETTINGS
@given(clusters(), traces())
def test_backfill_never_delays_the_top_reserved_job(cluster, trace):
    first: list = []

    def observe(s: Scheduler, res: PassResult) -> None:
        check_state(s, res)
        if res.reservations and not first:
            first.append((res.reservations[0].job.name, res.reservations[0].start))

    backfill = replay(cluster, trace, "backfill", observe)
    fifo = replay(cluster, trace, "fifo", check_state)
    assert all(r.end is not None for r in backfill.values() if r.rejected is None)
    assert all(r.end is not None for r in fifo.values() if r.rejected is None)
    if first:
        name, planned = first[0]
        assert backfill[name].start <= fifo[name].start
        assert backfill[name].start <= planned


@SETTINGS
@given(clusters(), traces())
def test_count_and_backfill_finish_every_job_that_fits(cluster, trace):
    for mode in ("count", "backfill"):
        records = replay(cluster, trace, mode, check_state)
        total = cluster.total_gpus
        for r in records.values():
            if r.gpus <= total and mode == "count":
                assert r.end is not None
            if r.rejected is None:
                assert r.start >= r.submit and r.end > r.start


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(-5, 5), st.integers(0, 20_000)),
                min_size=1, max_size=30),
       st.dictionaries(st.sampled_from("abc"), st.floats(0, 20), max_size=3),
       st.floats(0, 3), st.lists(st.integers(0, 29), max_size=10))
def test_queue_order_is_a_full_sort_by_effective_priority(jobs, fairshare, age_weight, drop):
    """The lazy merge of per-team lists (with inserts and removals) equals sorting the whole
    queue by effective priority, then submit time."""
    q = JobQueue(age_weight)
    for i, (team, prio, submit) in enumerate(jobs):
        spec = job(f"j{i}", {"name": "w", "gpus": 1}, team=team, priority=prio)
        q.add(q.make(spec, submit, i, 60.0, 0))
    for i in sorted(set(drop)):
        if f"j{i}" in q:
            q.remove(f"j{i}")
    got = [j.name for j in q.ordered(fairshare)]
    want = sorted(q.jobs.values(), key=lambda j: (
        round(q.static_key(j) - fairshare.get(j.team, 0.0), 6), j.submit, j.seq))
    assert got == [j.name for j in want]
    assert sum(q.shapes.values()) == len(q)


@st.composite
def inexact_traces(draw) -> list[TraceJob]:
    """Planned runtimes that are sometimes too long (early ends) and sometimes too short."""
    jobs = draw(traces())
    return [TraceJob(j.job_id, j.submit, j.duration, j.gpus, draw(st.sampled_from("ab")),
                     expected_runtime=draw(st.sampled_from(
                         (None, j.duration * 2, j.duration * 3, max(1, j.duration // 2)))),
                     line=j.line)
            for j in jobs]


@settings(SETTINGS, max_examples=400)
@given(clusters(), inexact_traces(), st.sampled_from(((1.0, 1.0, 1.0), (1.0, 1.1, 1.3))))
def test_reusing_the_last_passes_reservations_changes_nothing(cluster, trace, slowdown):
    """Reservations that still stand are reused instead of walked again: the replay must
    be the same as when every pass walks every reservation."""
    def walk_always(s: Scheduler, _: PassResult) -> None:
        s.reuse_reservations = False

    runs = []
    for observe in (None, walk_always):
        res = simulate(cluster, trace, SimOptions(PolicyConfig(), slowdown), observe=observe)
        runs.append([(r.job_id, r.start, r.end) for r in res.records])
    assert runs[0] == runs[1]
