"""With exact runtimes, a job backfilled in front of a reservation ends by the time the
reservation starts: no job is ever stopped there, and no GPU-second is lost. The stop
at a reservation's start is for jobs that overran their estimate; it also hides a
placement that ignored the pass's reservations (the reserved job then waits only the
grace), so the replays here assert that it never happens, not only that the reserved
job starts in time."""

from __future__ import annotations

import pytest

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.helpers import make_cluster

A100 = {"model": "dgx-a100", "switch": "s1"}        # 8 GPUs
CASES = {
    # `a` holds 4 GPUs until 1000, `big` (8) is reserved from then: the 4 free GPUs are
    # reserved ones, and `c` (2000 s) would run past 1000 on them: it waits for `big`
    "the only free GPUs are reserved": (
        [{"name": "h0", **A100}],
        [TraceJob("a", 0, 1000, 4), TraceJob("big", 1, 500, 8), TraceJob("c", 2, 2000, 4)],
        {"a": (0, 1000), "big": (1000, 1500), "c": (1500, 3500)}),
    # `big` is reserved on h0 from 1000; h0's 3 free GPUs fit `c` best, but it would run
    # past 1000 there: it backfills on h1 instead
    "the best fit is on the reserved host": (
        [{"name": "h0", **A100}, {"name": "h1", **A100}],
        [TraceJob("a", 0, 1000, 5), TraceJob("b", 0, 5000, 4), TraceJob("big", 1, 500, 8),
         TraceJob("c", 2, 2000, 3)],
        {"a": (0, 1000), "b": (0, 5000), "big": (1000, 1500), "c": (2, 2002)}),
    # found by the property (test_policy_properties.py): `j1` (24 GPUs) is reserved on
    # h2 and one dgx-1v from 2; `j2` backfills on the other dgx-1v
    "found by the property": (
        [{"name": "h0", "model": "dgx-1v", "switch": "s1"},
         {"name": "h1", "model": "dgx-1v", "switch": "s1"},
         {"name": "h2", "model": "dgx-2", "switch": "s1"}],
        [TraceJob("j0", 0, 2, 16), TraceJob("j1", 0, 1, 24), TraceJob("j2", 1, 32, 1)],
        {"j0": (0, 2), "j1": (2, 3), "j2": (1, 33)}),
}


@pytest.mark.parametrize("hosts, trace, want", CASES.values(), ids=CASES)
def test_a_backfilled_job_with_an_exact_runtime_is_never_stopped(hosts, trace, want):
    cfg = PolicyConfig(fairshare_weight=0, reserve_after=0)
    res = simulate(make_cluster(*hosts), trace, SimOptions(cfg, (1.0, 1.0, 1.0)))
    m = res.metrics()
    assert (m["overrun_stops"], m["preemptions"], m["timeouts"], m["unfinished"]) == (
        0, 0, 0, 0), m
    assert m["lost_gpu_hours"] == 0 and all(r.lost_gpu_s == 0 for r in res.records), [
        (r.job_id, r.lost_gpu_s) for r in res.records]
    # each job ran once, from its start for exactly its runtime: the reserved job starts
    # at its reservation, the backfilled one ahead of it
    assert {r.job_id: (r.start, r.end) for r in res.records} == want
    assert all(r.held_gpu_s == r.gpus * r.duration for r in res.records)
