"""Short garbage collections (service/heap.py): after a walk of the oldest generation what
survived is frozen, so the next walks skip the leader's large state; every THAW_EVERY
seconds it is thawed, and the walk after collects a cycle that died while frozen. And the
engine's explained pass leaves no reference cycle for the collector (it freed 50,000
objects a pass through walks of the whole heap)."""

from __future__ import annotations

import gc
import time
import weakref

from airflow_gpu.scheduler_core.engine.cluster import synthetic_cluster
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from airflow_gpu.scheduler_core.service import heap
from airflow_gpu.scheduler_core.simulation.trace import TraceJob, job_spec


class Node:
    pass


def test_a_walk_freezes_what_survived_and_a_thaw_lets_a_dead_cycle_go():
    heap.keep_walks_short()
    heap.keep_walks_short()                        # once per process, however often asked
    assert gc.callbacks.count(heap._after_walk) == 1
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a                    # a cycle: only the collector frees it
        gone = weakref.ref(a)
        gc.collect()
        assert gc.get_freeze_count() > 0           # what survived: frozen
        del a, b
        gc.collect()
        assert gone() is not None                  # frozen: not walked, not freed
        assert not heap.thaw_now_and_then(time.monotonic())     # not yet due
        assert heap.thaw_now_and_then(time.monotonic() + heap.THAW_EVERY + 1)
        gc.collect()
        assert gone() is None                      # thawed: the walk collected it
    finally:
        gc.unfreeze()


def test_an_explained_pass_leaves_no_garbage_cycle():
    now = time.time()
    sched = Scheduler(ClusterState(synthetic_cluster(4, "dgx-a100")), PolicyConfig(),
                      now=now - 60)
    for k in range(40):                     # 4 hosts of 8 GPUs: 4 run, 36 wait
        sched.submit(job_spec(TraceJob(f"j{k}", 0, 1, 8), 8, 4, 32 * 2**30), now - k,
                     3600)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = sched.schedule(now, explain=True)
        assert len(result.started) == 4 and len(result.pending) == 36   # reasons made
        del result
        gc.collect()
        assert [type(o).__name__ for o in gc.garbage][:10] == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
