"""Property tests of the queue policy (hypothesis): random small clusters and traces
replayed through the real scheduler with exact runtimes."""

from __future__ import annotations

import contextlib
import heapq
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.engine.cluster import Cluster
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.jobqueue import JobQueue
from airflow_gpu.scheduler_core.policy.reservations import earliest_end
from airflow_gpu.scheduler_core.policy.scheduler import PassResult, Rejected, Scheduler
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob, job_spec
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


def replay(cluster: Cluster, trace: list[TraceJob], mode: str, observe=None,
           slowdown=(1.0, 1.0, 1.0), **policy) -> dict:
    # one team, equal priorities; the scheduler plans with the slowdown the replay has
    cfg = PolicyConfig(mode=mode, fairshare_weight=0, locality_slowdown=slowdown, **policy)
    passes: list[float] = []

    def seen(s: Scheduler, res: PassResult) -> None:
        passes.append(res.now)
        observe(s, res)

    res = simulate(cluster, trace, SimOptions(cfg, slowdown),
                   observe=None if observe is None else seen)
    # the properties check in `observe`: it must have seen every pass
    assert observe is None or len(passes) == res.passes > 0
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


SLOWDOWNS = st.sampled_from(((1.0, 1.0, 1.0), (1.0, 1.1, 1.3)))


def named(*hosts: dict) -> Cluster:
    """A cluster as `clusters()` draws it, for an @example."""
    return _Named(make_cluster(*hosts), hosts)


@SETTINGS
@given(clusters(), traces(), SLOWDOWNS, st.sampled_from((0, 300)))
# a placement that ignored the pass's reservations put j2 on j1's: stopped at j1's start
# (so j1 still started in time), it showed only as a stop (test_exact_backfill.py)
@example(named({"name": "h0", "model": "dgx-1v", "switch": "s1"},
               {"name": "h1", "model": "dgx-1v", "switch": "s1"},
               {"name": "h2", "model": "dgx-2", "switch": "s1"}),
         [TraceJob("j0", 0, 2, 16), TraceJob("j1", 0, 1, 24), TraceJob("j2", 1, 32, 1)],
         (1.0, 1.0, 1.0), 0)
def test_a_protected_job_starts_no_later_than_its_first_reservation(
        cluster, trace, slowdown, reserve_after):
    """The wait guarantee with exact runtimes: once a job holds the protected reservation,
    nothing that backfills or arrives later delays it; and no job is stopped at a
    reservation it backfilled ahead of (it ends by then), so no GPU-second is lost."""
    bound: dict[str, float] = {}
    first: list = []              # (the first job reserved for, the pass that did it)

    def observe(s: Scheduler, res: PassResult) -> None:
        check_state(s, res)
        for r in res.reservations:
            if r.protected:
                bound.setdefault(r.job.name, r.start)
                if not first:
                    first.append((r.job.name, res.now))

    backfill = replay(cluster, trace, "backfill", observe, slowdown,
                      reserve_after=reserve_after)
    assert all(r.end is not None for r in backfill.values() if r.rejected is None)
    assert [(r.job_id, r.overrun_stops, r.lost_gpu_s) for r in backfill.values()
            if r.overrun_stops or r.lost_gpu_s] == []
    for name, start in bound.items():
        assert backfill[name].start <= start, (name, backfill[name].start, start)
    if first and reserve_after == 0 and slowdown == (1.0, 1.0, 1.0) and \
            first[0][1] == backfill[first[0][0]].submit:
        # protected from its submission on (not only once the band's job protected before
        # it started), the first reserved job starts no later than in strict order
        name = first[0][0]
        fifo = replay(cluster, trace, "fifo", check_state)
        assert backfill[name].start <= fifo[name].start


@SETTINGS
@given(clusters(), traces(), SLOWDOWNS)
def test_planned_ends_are_start_plus_estimate_times_the_placements_factor(
        cluster, trace, slowdown):
    ends = {}

    def observe(s: Scheduler, res: PassResult) -> None:
        for queued, placed in res.started:
            factor = slowdown[placed.tier]
            assert s.state.expected_end[queued.name] == pytest.approx(
                res.now + queued.runtime * factor)
            ends[queued.name] = s.state.expected_end[queued.name]

    records = replay(cluster, trace, "backfill", observe, slowdown)
    for r in records.values():   # the replay runs each job exactly as long as planned
        if r.end is not None:
            assert r.end == pytest.approx(ends[r.job_id if r.job_id[0].isalnum() else
                                                 f"job-{r.job_id}"])


@SETTINGS
@given(clusters(), traces(), SLOWDOWNS)
def test_the_walk_chooses_the_earliest_expected_end_it_tried(cluster, trace, slowdown):
    checked = []

    def observe(s: Scheduler, res: PassResult) -> None:
        for queued in list(s.queue.jobs.values())[:3]:
            tried: list = []
            got = earliest_end(queued, s.state, s.reg, res.now, res.reservations,
                               lambda tier, q=queued: s.runtime(q, tier), s.best_tier(queued),
                               tried=tried)
            if got is None:
                assert not tried
                continue
            assert got.end == min(end for _, _, end in tried)
            assert (got.start, got.tier, got.end) in tried
            assert got.end == pytest.approx(got.start + queued.runtime * slowdown[got.tier])
            checked.append(queued.name)
        check_state(s, res)

    records = replay(cluster, trace, "backfill", observe, slowdown)
    # the checks are in the callback: a job that waited was checked in some pass
    if any(r.start is not None and r.start > r.submit for r in records.values()):
        assert checked


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


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(-2, 2), st.integers(0, 20_000),
                          st.sampled_from((1, 2, 8, 16)), st.integers(60, 100_000)),
                min_size=1, max_size=30),
       st.dictionaries(st.sampled_from("abc"), st.floats(0, 20), max_size=3),
       st.floats(0, 3), st.floats(0, 200), st.integers(-1, 20_001),
       st.lists(st.integers(0, 29), max_size=10))
def test_queue_order_is_bands_then_the_protected_job_then_score(
        jobs, fairshare, age_weight, size_weight, protect_before, drop):
    """The lazy merge of per-team lists (with inserts and removals) equals sorting the
    whole queue: by band; in each band its oldest job if submitted by `protect_before`,
    then the others by score (age, fair share, size), then submit time."""
    q = JobQueue(age_weight, size_weight)
    for i, (team, prio, submit, n, runtime) in enumerate(jobs):
        spec = job(f"j{i}", {"name": "w", "replicas": max(1, n // 8), "gpus": min(n, 8)},
                   team=team, priority=prio)
        q.add(q.make(spec, submit, i, float(runtime), 0))
    for i in sorted(set(drop)):
        if f"j{i}" in q:
            q.remove(f"j{i}")
    got = [(j.name, p) for j, p in q.ordered(fairshare, protect_before)]
    want = []
    for band in sorted({j.base for j in q.jobs.values()}, reverse=True):
        mine = [j for j in q.jobs.values() if j.base == band]
        oldest = min(mine, key=lambda j: (j.submit, j.seq))
        first = [oldest] if oldest.submit <= protect_before else []
        want += [(j.name, True) for j in first] + [(j.name, False) for j in sorted(
            (j for j in mine if j not in first), key=lambda j: (
                round(q.static_key(j) - fairshare.get(j.team, 0.0), 6), j.submit, j.seq))]
    assert got == want
    assert q.protected(protect_before) == sum(p for _, p in want)
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
@given(clusters(), inexact_traces(), SLOWDOWNS, st.sampled_from((0, 300)))
def test_reusing_the_last_passes_reservations_changes_nothing(cluster, trace, slowdown,
                                                              reserve_after):
    """Reservations that still stand are reused instead of walked again: the replay must
    be the same as when every pass walks every reservation."""
    def walk_always(s: Scheduler, _: PassResult) -> None:
        s.reuse_reservations = False

    runs = []
    for observe in (None, walk_always):
        res = simulate(cluster, trace, SimOptions(PolicyConfig(reserve_after=reserve_after),
                                                  slowdown), observe=observe)
        runs.append([(r.job_id, r.start, r.end) for r in res.records])
    assert runs[0] == runs[1]


def replay_with_liars(cluster: Cluster, trace: list[TraceJob], grace: int,
                      slowdown=(1.0, 1.0, 1.0), reserve_after: float = 0
                      ) -> tuple[dict, dict, set]:
    """Replay where every job runs exactly as planned unless it was backfilled in front
    of a reservation: those run on past it, as a job that declared far too short a
    runtime and ignores SIGTERM would, until they are stopped at its start + grace and
    requeued (as the service and the simulator do); admitted again, they run as planned
    unless backfilled again. Returns [first start, end, backfilled] per job name, the
    protected reservations' first starts, and the jobs that were backfilled."""
    # the jobs here run as planned: learning from their runtimes would feed each plan back
    # into the next (test_correction.py replays real runtimes with learning on)
    cfg = PolicyConfig(fairshare_weight=0, locality_slowdown=slowdown, learn_slowdown=False,
                       correct_estimates="off", reserve_after=reserve_after,
                       stop_grace=grace)
    s = Scheduler(ClusterState(cluster), cfg)
    host_gpus = cluster.max_host_gpus
    trace = sorted(trace, key=lambda t: t.submit)
    ends: list[tuple[float, str]] = []
    runs: dict[str, list] = {}
    promised: dict[str, float] = {}
    cut: set[str] = set()
    i = 0
    while i < len(trace) or ends:
        now = min(trace[i].submit if i < len(trace) else math.inf,
                  ends[0][0] if ends else math.inf)
        while ends and ends[0][0] == now:
            name = heapq.heappop(ends)[1]
            if runs[name][2]:
                s.requeue(name, now)         # overran into the reservation: back in line
            else:
                s.finish(name, now, completed=True)
                runs[name][1] = now
        while i < len(trace) and trace[i].submit == now:
            t = trace[i]
            i += 1
            with contextlib.suppress(Rejected):
                s.submit(job_spec(t, host_gpus, 4, 32 * 2**30), now,
                         t.expected_runtime or t.duration)
        res = s.schedule(now)
        check_state(s, res)
        for r in res.reservations:
            if r.protected:
                promised.setdefault(r.job.name, r.start)
        cut |= set(res.cut)
        for queued, _ in res.started:
            name = queued.name
            end = (s.state.hard_end[name] if name in res.cut
                   else s.state.expected_end[name])
            runs[name] = [runs.get(name, [now])[0], None, name in res.cut]
            heapq.heappush(ends, (end, name))
    return runs, promised, cut


@settings(SETTINGS, max_examples=300)
@given(clusters(), inexact_traces(), SLOWDOWNS, st.sampled_from((0, 30, 600)),
       st.sampled_from((0, 20, 200)))
def test_no_backfilled_job_delays_a_reservation_by_more_than_the_grace(
        cluster, trace, slowdown, grace, reserve_after):
    """With limits enforced, a protected job starts no later than its first reservation
    plus the grace, whatever runtimes the jobs backfilled in front of it declared (and
    however long jobs of their sizes wait to be protected: reserve_after_scale)."""
    runs, promised, _ = replay_with_liars(cluster, trace, grace, slowdown, reserve_after)
    for name, start in promised.items():
        assert runs[name][0] <= start + grace, (name, runs[name][0], start, grace)


def test_a_job_backfilled_in_front_of_a_reservation_is_stopped_at_its_start_and_requeued():
    """One 8-GPU host: `a` holds 4 GPUs for 1000 s, `big` (8 GPUs) is reserved from 1000,
    `liar` declares 100 s on the other 4 GPUs but runs 10,000 s. It yields at the
    reservation's start: stopped then (`big` waits only the grace) and requeued, it runs
    its whole work again after `big` (no checkpoint in its 998 s) and ends once, never
    `timeout`."""
    cluster = make_cluster({"name": "h0", "model": "dgx-a100"})
    trace = [TraceJob("a", 0, 1000, 4), TraceJob("big", 1, 500, 8),
             TraceJob("liar", 2, 10_000, 4, expected_runtime=100)]
    cfg = PolicyConfig(fairshare_weight=0, reserve_after=0, stop_grace=30)
    res = simulate(cluster, trace, SimOptions(cfg, (1.0, 1.0, 1.0)))
    got = {r.job_id: r for r in res.records}
    liar = got["liar"]
    assert (liar.start, liar.end, liar.timeout, liar.overrun_stops) == (
        2, 1530 + 10_000, False, 1)
    assert liar.lost_gpu_s == 4 * (998 + 30) and liar.preemptions == 0
    assert got["big"].start == 1030 and got["big"].end == 1530 and not got["big"].timeout
    m = res.metrics()
    assert (m["timeouts"], m["overrun_stops"], m["jobs"]) == (0, 1, 3)
    runs, promised, cut = replay_with_liars(cluster, trace, 30)
    assert promised == {"big": 1000} and cut == {"liar"} and runs["big"][0] == 1030


def test_a_promised_job_waiting_for_locality_keeps_its_promise():
    """Found by the property above: `j1` (24 GPUs) is promised t=2; at 2 it could start
    across switches but waits for h2 + h0 (free at 3). Its reservation for locality must
    still hold from the promise, or `j0` backfills on h2 with its limit cut only to 3 and,
    overrunning, pushes `j1` past its promise plus the grace."""
    cluster = make_cluster(
        {"name": "h0", "model": "dgx-1v", "switch": "s1"},
        {"name": "h1", "model": "dgx-1v", "switch": "s1"},
        {"name": "h2", "model": "dgx-2", "switch": "s1"},
        {"name": "h3", "model": "dgx-1v", "switch": "s2"})
    trace = [TraceJob("j3", 0, 2, 16), TraceJob("j4", 0, 3, 8)] + [
        TraceJob(f"j{k}", 0, 1, 1) for k in (5, 6, 7, 8)] + [
        TraceJob("j1", 1, 6, 24), TraceJob("j2", 1, 1, 1), TraceJob("j0", 2, 1, 16)]
    runs, promised, cut = replay_with_liars(cluster, trace, 30, (1.0, 1.1, 1.3))
    assert promised == {"j1": 2.0} and "j2" in cut
    assert runs["j1"][0] <= 2.0 + 30
