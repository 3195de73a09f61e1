"""Estimates corrected by what each team's jobs really ran (policy/correction.py): a team
that under-declares is planned as long as it runs, an honest one is left alone, and a
replay shows that under-declaring no longer buys an earlier start."""

from __future__ import annotations

import math
import random
from statistics import mean

import pytest

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.correction import EstimateCorrection, source
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from airflow_gpu.scheduler_core.policy.timemodel import LocalityModel
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.helpers import job, make_cluster

ONE = {"cluster": "one", "hosts": [{"name": "h0", "model": "dgx-a100"}]}


def test_a_team_that_runs_three_times_its_estimates_is_planned_so():
    c = EstimateCorrection("up", 0.5)
    assert c.factor("liars", "estimate") == 1.0          # nothing seen: taken at its word
    for _ in range(300):
        c.observe("liars", "estimate", 1000, 3000)
        c.observe("honest", "estimate", 1000, 1000)
        c.observe("padders", "estimate", 4000, 1000)     # ask for 4x what they need
    assert c.factor("liars", "estimate") == pytest.approx(3.0, rel=0.05)
    assert c.factor("honest", "estimate") == 1.0
    # `up`: a team's long estimates stand; `both` plans them as short as they run
    assert c.factor("padders", "estimate") == 1.0
    both = EstimateCorrection("both", 0.5)
    for _ in range(300):
        both.observe("padders", "estimate", 4000, 1000)
    assert both.factor("padders", "estimate") == pytest.approx(0.25, rel=0.05)
    # kept apart: a team's time limits are not corrected by its estimates' record
    assert c.factor("liars", "limit") == 1.0
    assert [(r["team"], r["samples"]) for r in c.report()] == [
        ("honest", 300), ("liars", 300), ("padders", 300)]
    off = EstimateCorrection("off")
    off.observe("liars", "estimate", 1000, 3000)
    assert off.factor("liars", "estimate") == 1.0 and off.report() == []


def test_a_higher_quantile_plans_a_noisy_team_longer_and_recent_jobs_count_most():
    rng = random.Random(7)
    median, q80 = EstimateCorrection("up", 0.5), EstimateCorrection("up", 0.8)
    for _ in range(400):
        actual = 1000 * math.exp(rng.gauss(0, 0.5))      # right at the median
        median.observe("t", "estimate", 1000, actual)
        q80.observe("t", "estimate", 1000, actual)
    assert median.factor("t", "estimate") <= 1.1
    # about exp(0.84 x 0.5) = 1.52: four of five runs end within the plan
    assert 1.3 < q80.factor("t", "estimate") < 1.8
    for _ in range(300):                                 # the team mends its ways
        median.observe("t", "estimate", 1000, 1000)
        q80.observe("t", "estimate", 1000, 1000)
    assert q80.factor("t", "estimate") < 1.1


def test_the_scheduler_plans_a_teams_jobs_with_its_learned_factor():
    s = Scheduler(ClusterState(make_cluster(ONE["hosts"][0])), PolicyConfig())
    t = 0.0
    for i in range(60):     # each of the team's jobs runs twice its estimate
        s.submit(job(f"j{i}", {"name": "w", "gpus": 1}, expected_runtime=600, team="liars"), t)
        s.schedule(t)
        t += 1200
        s.finish(f"j{i}", t, completed=True)
    s.submit(job("next", {"name": "w", "gpus": 1}, expected_runtime=600, team="liars"), t)
    s.submit(job("other", {"name": "w", "gpus": 1}, expected_runtime=600, team="honest"), t)
    planned = {n: q.runtime for n, q in s.queue.jobs.items()}
    assert planned["other"] == 600
    assert 1100 < planned["next"] < 1600          # 2x, shrunk a little toward the prior
    assert s.queue.jobs["next"].estimate == 600   # what it declared, as declared
    # never past its own time limit
    s.submit(job("capped", {"name": "w", "gpus": 1}, expected_runtime=600, time_limit=700,
                 team="liars"), t)
    assert s.queue.jobs["capped"].runtime == 700
    off = Scheduler(ClusterState(make_cluster(ONE["hosts"][0])),
                    PolicyConfig(correct_estimates="off"))
    assert off.timemodel.estimates.factor("liars", "estimate") == 1.0


def test_a_spread_gang_teaches_the_slowdown_not_the_teams_estimates():
    """A gang across switches that ran 1.5x its estimate: placement or a short estimate?
    Counted as both it would be planned long twice; it teaches the slowdown only."""
    m = LocalityModel((1.0, 1.1, 1.3), True, EstimateCorrection("up", 0.5))
    for _ in range(100):
        m.observe_run(None, "vision", "estimate", 2, 1000, 1500)
    assert m.estimates.factor("vision", "estimate") == 1.0 and m.factors()[2] > 1.4
    for _ in range(100):      # on one host, a long run is the estimate's
        m.observe_run(None, "vision", "estimate", 0, 1000, 1500)
    assert m.estimates.factor("vision", "estimate") == pytest.approx(1.5, rel=0.05)


def test_source_tells_a_limit_from_an_estimate():
    assert source(None, 3600) == "limit"
    assert source(600, 3600) == source(600, None) == source(None, None) == "estimate"


def liar_trace(lie: float) -> list[TraceJob]:
    """A loaded 8-GPU host: two teams submit the same kind of work; `liars` declare
    1/lie of their runtime, `honest` the runtime itself."""
    rng = random.Random(11)
    out, t = [], 0.0
    for i in range(1500):
        gpus = rng.choice((1, 1, 2, 4, 8))
        duration = 60.0 * rng.randint(10, 240)
        team = ("liars", "honest")[i % 2]
        out.append(TraceJob(f"j{i}", t, duration, gpus, team=team,
                            expected_runtime=duration / lie if team == "liars" else duration,
                            line=i + 2))
        t += duration * gpus / 8 / 0.97 * rng.uniform(0.5, 1.5)
    return out


def by_team(policy: PolicyConfig, lie: float) -> dict[str, tuple[float, int]]:
    res = simulate(make_cluster(ONE["hosts"][0]), liar_trace(lie), SimOptions(policy))
    assert res.metrics()["timeouts"] == 0          # no estimate ends a job
    return {team: (mean(r.start - r.submit for r in res.records if r.team == team),
                   sum(r.overrun_stops for r in res.records if r.team == team))
            for team in ("liars", "honest")}


def test_under_declaring_buys_no_earlier_start_once_corrected():
    honest = by_team(PolicyConfig(), 1)             # both halves honest: the control
    off = by_team(PolicyConfig(correct_estimates="off"), 4)
    on = by_team(PolicyConfig(), 4)
    # uncorrected, lying pays: the liars start sooner than the same jobs declared
    # honestly, and their overruns are stopped and run again
    assert off["liars"][0] < 0.8 * honest["liars"][0]
    assert off["liars"][1] > 10
    # corrected, it does not, and hardly anything is stopped
    assert on["liars"][0] > 0.9 * honest["liars"][0]
    assert on["liars"][1] <= off["liars"][1] / 4
    assert on["honest"][1] == 0
