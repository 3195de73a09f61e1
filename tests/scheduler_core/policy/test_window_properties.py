"""Property tests of admins' reservations (hypothesis): random small clusters, traces and
windows replayed through the real scheduler. No job runs on a maintenance window's hosts
while it lasts, no other team's job on a team window's; a job that asks for a team window
runs only on its hosts, from its start, and is gone by its end plus its grace; and the
state stays exact with the windows' holds taken and dropped every pass."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.windows import Window
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.scheduler_core.policy.test_policy_properties import SETTINGS, check_state, clusters


@st.composite
def windows_on(draw, hosts: list[str]) -> list[Window]:
    out: list[Window] = []
    for k in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, 600))
        end = start + draw(st.integers(50, 800))
        taken = {h for w in out if w.start < end and w.end > start for h in w.hosts}
        free = [h for h in hosts if h not in taken]
        if not free:
            continue
        mine = draw(st.lists(st.sampled_from(free), min_size=1, max_size=len(free),
                             unique=True))
        maint = draw(st.booleans())
        out.append(Window(f"w{k}", tuple(mine), float(start), float(end),
                          frozenset() if maint else frozenset({"t1"}), maint))
    return out


def scenario(data):
    """Drawn step by step, so a failing example prints each part."""
    cluster = data.draw(clusters(), "cluster")
    windows = data.draw(windows_on([h.name for h in cluster.hosts]), "windows")
    trace = data.draw(jobs([w.name for w in windows if not w.maint]), "trace")
    return cluster, windows, trace


@st.composite
def jobs(draw, team: list[str]) -> list[TraceJob]:
    trace = []
    for i in range(draw(st.integers(2, 12))):
        asks = draw(st.sampled_from([None, *team])) if team else None
        trace.append(TraceJob(
            f"j{i}", draw(st.integers(0, 500)), draw(st.integers(1, 600)),
            draw(st.sampled_from((1, 2, 4, 8))), team="t1" if asks or draw(st.booleans())
            else "t2", expected_runtime=draw(st.sampled_from((None, 60.0, 300.0))),
            line=i + 2, reservation=asks))
    return trace


@SETTINGS
@given(st.data())
def test_windows_keep_their_hosts_and_their_jobs_inside(data):
    cluster, windows, trace = scenario(data)
    by_name = {w.name: w for w in windows}
    asks = {t.job_id: t.reservation for t in trace}
    seen: dict[str, tuple[float, set[str]]] = {}       # job -> (start, hosts)
    graces: dict[str, float] = {}
    ends: dict[str, float] = {}

    passes: list[float] = []

    def observe(s, result):
        passes.append(result.now)
        check_state(s, result)
        now = result.now
        for job, placed in result.started:
            seen[job.name] = (now, {a.host.name for a in placed.allocations})
            graces[job.name] = job.grace
        for name in list(seen):
            if name not in s.running and name not in ends:
                ends[name] = now
        for name, job in s.running.items():
            hosts = {a.host.name for a in s.state.allocations[name]}
            for w in windows:
                if not (w.start <= now < w.end) or not hosts & set(w.hosts):
                    continue
                ok = (not w.maint and asks.get(name) == w.name)
                # a job that started before the window yields at its start: it may be
                # stopping (its signal sent) through its grace
                started, _ = seen[name]
                stopping = started < w.start and now <= w.start + job.grace + 1e-6
                assert ok or stopping or name in s.stopping, (
                    f"{name} on {sorted(hosts & set(w.hosts))} of {w.name} at {now}")

    res = simulate(cluster, trace, SimOptions(PolicyConfig(fairshare_weight=0),
                                              windows=windows), observe=observe)
    # the checks above ran in the callback: it saw every pass and every job that started
    assert len(passes) == res.passes > 0
    assert set(seen) == {r.job_id for r in res.records if r.start is not None}
    for name, (start, hosts) in seen.items():
        w = by_name.get(asks.get(name) or "")
        if w is None:
            continue
        assert hosts <= set(w.hosts), (name, hosts, w)
        assert w.start <= start < w.end, (name, start, w)
        # stopped at the window's end, gone by then plus its grace
        assert ends.get(name, -math.inf) <= w.end + graces[name] + 1e-6, (name, ends, w)
