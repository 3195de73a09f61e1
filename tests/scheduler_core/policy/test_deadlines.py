"""Deadlines: the spec's fields, a queued job's latest start."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.errors import InputError, validate
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.policy.config import PolicyConfig
from airflow_gpu.scheduler_core.policy.scheduler import Scheduler
from tests.helpers import job, make_cluster

ONE_HOST = ({"name": "dgx-1", "model": "dgx-a100"},)
ROLES = [{"name": "w", "gpus": 1}]


def _spec(**fields) -> JobSpec:
    return validate(JobSpec, {"name": "j", "roles": ROLES, **fields}, "job.yaml")


def test_spec_deadline_and_downstream():
    spec = _spec(deadline="2026-12-05T06:00:00Z", downstream="2h")
    assert spec.deadline == datetime(2026, 12, 5, 6, tzinfo=UTC)
    assert spec.downstream == 7200
    assert _spec(deadline="2026-12-05T07:00:00+01:00").deadline == spec.deadline
    assert _spec(deadline=datetime(2026, 12, 5, 6, tzinfo=UTC)).deadline == spec.deadline
    assert _spec(downstream=90).downstream == 90
    plain = _spec()
    assert plain.deadline is None and plain.downstream == 0
    # stored as JSON and read back (the service's rows)
    again = JobSpec.model_validate(spec.model_dump(mode="json"))
    assert again.deadline == spec.deadline and again.downstream == 7200


@pytest.mark.parametrize("fields,words", [
    ({"deadline": "2026-12-05T06:00:00"}, ["deadline:", "2026-12-05T06:00:00", "no time zone",
                                           "2026-12-05T06:00:00Z"]),
    ({"deadline": "tomorrow"}, ["deadline:", "'tomorrow'", "2026-12-05T06:00:00Z"]),
    ({"deadline": 5}, ["deadline:", "time zone"]),
    ({"downstream": "-2h"}, ["downstream:", "'-2h'", "negative"]),
    ({"downstream": "soon"}, ["downstream:", "'soon'", "90m"]),
])
def test_spec_deadline_errors_name_the_field_the_value_and_the_fix(fields, words):
    with pytest.raises(InputError) as exc:
        _spec(**fields)
    for w in words:
        assert w in str(exc.value)


def _scheduler(**policy) -> Scheduler:
    return Scheduler(ClusterState(make_cluster(*ONE_HOST)), PolicyConfig(**policy))


def test_latest_start_is_the_deadline_less_runtime_and_downstream():
    s = _scheduler()
    a = s.submit(job("a", *ROLES, expected_runtime=3600, downstream="2h"), 0.0,
                 deadline=20_000.0)
    assert (a.deadline, a.latest_start) == (20_000.0, 20_000.0 - 3600 - 7200)
    b = s.submit(job("b", *ROLES, expected_runtime=3600), 0.0)
    assert b.deadline == math.inf and b.latest_start == math.inf
    # without a clock of its own, the spec's deadline as Unix time (the service's clock)
    when = datetime(2026, 12, 5, 6, tzinfo=UTC)
    c = s.submit(job("c", *ROLES, expected_runtime=600, deadline=when.isoformat()), 0.0)
    assert c.latest_start == when.timestamp() - 600


def test_a_requeued_job_keeps_its_deadline_with_the_work_it_has_left():
    s = _scheduler()
    s.submit(job("a", *ROLES, expected_runtime=3600, downstream=100), 0.0, deadline=10_000.0)
    s.schedule(0.0)
    again = s.requeue("a", 1000.0, runtime=1800)
    assert again.deadline == 10_000.0 and again.latest_start == 10_000.0 - 1800 - 100


def _order(s: Scheduler, now: float) -> list[str]:
    return [j.name for j, _, _ in s.priorities(now)]


def _queue(**policy) -> Scheduler:
    """One busy host; band 0: small (the highest score), big, late (a deadline) and
    relaxed (a far deadline); band 5: top."""
    s = _scheduler(**{"reserve_after": 86400, "fairshare_weight": 0, "deadline_slack": "2h",
                      **policy})
    s.submit(job("busy", {"name": "w", "gpus": 8}, expected_runtime=99_999), 0.0)
    s.schedule(0.0)
    s.submit(job("small", *ROLES, expected_runtime=60), 10.0)
    s.submit(job("big", {"name": "w", "gpus": 8}, expected_runtime=36_000), 10.0)
    # latest start 20,000 - 3,600 - 3,600 = 12,800
    s.submit(job("late", {"name": "w", "gpus": 4}, expected_runtime=3600, downstream=3600),
             10.0, deadline=20_000.0)
    s.submit(job("relaxed", {"name": "w", "gpus": 4}, expected_runtime=3600), 10.0,
             deadline=200_000.0)
    s.submit(job("top", {"name": "w", "gpus": 8}, expected_runtime=36_000, priority=5), 10.0)
    return s


def test_a_short_slack_job_goes_ahead_in_its_band_but_not_of_a_higher_band():
    s = _queue()                                   # deadline_slack: 2h
    # at 5,000 late's slack is 7,800 s: over 2h, the score order (small work first)
    assert _order(s, 5000.0) == ["top", "small", "late", "relaxed", "big"]
    # at 6,000 its slack is 6,800 s, under 2h: it overtakes small (a higher score), not
    # top (a higher band); relaxed's long slack keeps its place
    assert _order(s, 6000.0) == ["top", "late", "small", "relaxed", "big"]
    # the pass tries them in that order
    s.finish("busy", 6000.0)
    started = [j.name for j, _ in s.schedule(6000.0).started]
    assert started == ["top"]


def test_urgent_jobs_go_least_slack_first():
    s = _queue()
    s.submit(job("later", *ROLES, expected_runtime=600), 10.0, deadline=15_000.0)  # 14,400
    s.submit(job("sooner", {"name": "w", "gpus": 8}, expected_runtime=3600), 10.0,
             deadline=15_000.0)                                                 # 11,400
    assert _order(s, 10_000.0)[:5] == ["top", "sooner", "late", "later", "small"]
    # a lost cause (its latest start, 4,400, has passed) comes after those that can still
    # meet their deadlines, ahead of the band's others
    s.submit(job("lost", *ROLES, expected_runtime=600), 10.0, deadline=5000.0)
    assert _order(s, 10_000.0)[:6] == ["top", "sooner", "late", "later", "lost", "small"]
    assert _order(s, 4000.0)[:2] == ["top", "lost"]     # at 4,000 it still could


def test_deadline_slack_off_gives_the_old_order_exactly():
    for off in (0, "off", False):
        s = _queue(deadline_slack=off)
        assert s.config.deadline_slack == 0
        plain = _scheduler(reserve_after=86400, fairshare_weight=0)
        plain.submit(job("busy", {"name": "w", "gpus": 8}, expected_runtime=99_999), 0.0)
        plain.schedule(0.0)
        for name in ("small", "big", "late", "relaxed", "top"):
            spec = s.queue.jobs[name].spec.model_copy(update={"downstream": 0})
            plain.submit(spec, 10.0, runtime=s.queue.jobs[name].estimate)
        for now in (5000.0, 6000.0, 13_000.0):
            assert _order(s, now) == _order(plain, now) == [
                "top", "small", "late", "relaxed", "big"]


def test_urgent_jobs_reserve_before_a_new_protected_job_whose_promise_then_stands():
    s = _queue(reserve_after_scale=1)
    # at 90,000 every band-0 job has waited reserve_after: small (submitted first) is
    # protected, but no pass has promised it a start yet: late, whose slack ran out long
    # ago, reserves first and small's promise is made behind it
    assert _order(s, 90_000.0)[:3] == ["top", "late", "small"]
    protected = [j.name for j, p, _ in s.priorities(90_000.0) if p]
    assert "small" in protected
    s.schedule(90_000.0)
    assert "small" in s.promised
    # once promised, it keeps its place ahead of the urgent ones
    assert _order(s, 90_001.0)[:3] == ["top", "small", "late"]


def test_count_and_fifo_keep_the_plain_order():
    for mode in ("count", "fifo"):
        s = _queue(mode=mode)
        assert s.urgent_before(6000.0) == -math.inf


def test_queue_removes_deadline_jobs_cleanly():
    s = _queue()
    for name in ("late", "relaxed"):
        s.finish(name, 100.0)                  # cancelled while pending
    assert not s.queue._by_latest
    assert _order(s, 6000.0) == ["top", "small", "big"]


def test_policy_deadline_slack_and_on_deadline_rule_are_checked():
    assert PolicyConfig(deadline_slack="30m").deadline_slack == 1800
    with pytest.raises(InputError, match="deadline_slack"):
        validate(PolicyConfig, {"deadline_slack": "soon"}, "policy.yaml")
    rule = validate(PolicyConfig, {"preemption": {"rules": [
        {"on_deadline": True, "preempts_below": 10}]}}, "p").preemption
    below = rule.victims_below(0, None, late=True)            # its own band, none higher
    assert 0 < below <= math.nextafter(0, math.inf)
    assert rule.victims_below(20, None, late=True) == 10
    assert rule.victims_below(20, None, late=False) == -math.inf
    with pytest.raises(InputError, match="on_deadline"):
        validate(PolicyConfig, {"preemption": {"rules": [{"preempts_below": 10}]}}, "p")


def _at_risk(low_runtime: float, etl_priority: int = 10, rule: float | None = 10,
             low_deadline: float | None = None, **low) -> Scheduler:
    """One host, `low` on it; etl (8 GPUs, 1 h, due at 10,000: latest start 6,400) waits.
    `rule`: the preempts_below of a rule on_deadline (None: no preemption settings)."""
    s = _scheduler() if rule is None else _scheduler(preemption={
        "rules": [{"on_deadline": True, "preempts_below": rule}],
        "min_run_time": 0, "min_saved_wait": 0})
    s.submit(job("low", {"name": "w", "gpus": 8}, expected_runtime=low_runtime, **low), 0.0,
             deadline=low_deadline)
    s.schedule(0.0)
    s.submit(job("etl", {"name": "w", "gpus": 8}, expected_runtime=3600,
                 priority=etl_priority), 10.0, deadline=10_000.0)
    return s


def test_a_job_preempts_under_an_on_deadline_rule_once_waiting_would_miss():
    # low is expected to end at 6,000: etl can wait for it and still start by 6,400
    s = _at_risk(6000)
    assert not s.schedule(5000.0).preempted
    # low overruns its estimate: at 6,400 etl's slack has run out
    got = s.schedule(6400.0).preempted
    assert [(p.victim.name, p.by.name, p.reason) for p in got] == [("low", "etl", "priority")]
    # low runs until 99,999: waiting would miss, so etl preempts at once, 1,400 s of
    # slack still left
    s = _at_risk(99_999)
    got = s.schedule(5000.0).preempted
    assert [(p.victim.name, p.by.name) for p in got] == [("low", "etl")]


def test_an_on_deadline_rule_stops_own_band_work_without_a_deadline_only():
    # etl and low in band 0 (below the rule's 10): low has no deadline, etl stops it
    s = _at_risk(99_999, etl_priority=0)
    assert [p.victim.name for p in s.schedule(5000.0).preempted] == ["low"]
    # low has a deadline of its own (far off): never stopped for another's
    s = _at_risk(99_999, etl_priority=0, low_deadline=500_000.0)
    assert not s.schedule(5000.0).preempted
    # a higher band is never stopped, whatever preempts_below says
    s = _at_risk(99_999, rule=100, priority=50)
    assert not s.schedule(6400.0).preempted
    # and without the rule, no late job stops anything
    s = _at_risk(99_999, rule=None)
    assert not s.schedule(6400.0).preempted


TWO_HOSTS = ({"name": "dgx-[1-2]", "model": "dgx-a100", "rack": "r1", "switch": "s1"},)


def test_a_gangs_latest_start_counts_its_slowdown_across_hosts():
    s = Scheduler(ClusterState(make_cluster(*TWO_HOSTS)),
                  PolicyConfig(locality_slowdown=(1.0, 1.1, 1.3)))
    gang = s.submit(job("gang", {"name": "w", "replicas": 2, "gpus": 8},
                        expected_runtime=1000), 0.0, deadline=10_000.0)
    one = s.submit(job("one", {"name": "w", "gpus": 8}, expected_runtime=1000), 0.0,
                   deadline=10_000.0)
    assert gang.latest_start == 10_000.0 - 1100      # two hosts on one switch: x 1.1
    assert one.latest_start == 10_000.0 - 1000


def test_an_urgent_jobs_reservation_does_not_hold_back_one_with_less_slack():
    """dgx-1 free, dgx-2 busy until 1000. B (both hosts, latest start 1400) reserves
    them from 1000. A (one host, 2000 s, latest start 500) comes at 10: it goes first
    and takes dgx-1 now; B's reservation is not kept in its way."""
    s = Scheduler(ClusterState(make_cluster(*TWO_HOSTS)),
                  PolicyConfig(locality_slowdown=(1.0, 1.0, 1.0)))
    eight = {"name": "w", "gpus": 8}
    s.submit(job("busy", eight, expected_runtime=1000, placement={"hosts": "dgx-2"}), 0.0)
    s.schedule(0.0)
    s.submit(job("B", {"name": "w", "replicas": 2, "gpus": 8}, expected_runtime=3600), 1.0,
             deadline=5000.0)
    assert not s.schedule(1.0).started
    s.submit(job("A", eight, expected_runtime=2000), 10.0, deadline=2500.0)
    assert [j.name for j, _ in s.schedule(10.0).started] == ["A"]


def _gang_starts(**policy) -> dict[str, float]:
    """Two hosts: A holds host 1 until 1000, B host 2 until 500. U (both hosts, due at
    4700: latest start 1100) and C (one host, 2000 s: smaller work, a higher score)."""
    s = Scheduler(ClusterState(make_cluster(*TWO_HOSTS)),
                  PolicyConfig(locality_slowdown=(1.0, 1.0, 1.0), **policy))
    eight = {"name": "w", "gpus": 8}
    s.submit(job("A", eight, expected_runtime=1000), 0.0)
    s.submit(job("B", eight, expected_runtime=500), 0.0)
    s.schedule(0.0)
    s.submit(job("U", {"name": "w", "replicas": 2, "gpus": 8}, expected_runtime=3600), 1.0,
             deadline=4700.0)
    s.submit(job("C", eight, expected_runtime=2000), 1.0)
    got = {}
    for now, ended in ((1.0, None), (500.0, "B"), (1000.0, "A"), (2500.0, "C")):
        if ended:
            s.finish(ended, now)
        got.update({j.name: now for j, _ in s.schedule(now).started})
    return got


def test_an_urgent_gang_gets_a_reservation_so_smaller_work_cannot_take_its_hosts():
    # urgent: U holds both hosts from 1000; C, which would end at 2500, cannot start on
    # host 2 at 500 in front of it
    assert _gang_starts(deadline_slack="2h") == {"U": 1000.0}       # C after it, at 4600
    # priority only: C takes host 2 at 500, U waits for it until 2500 and misses
    assert _gang_starts(deadline_slack=0) == {"C": 500.0, "U": 2500.0}



def test_a_waiting_job_that_cannot_meet_its_deadline_says_so_with_the_numbers():
    """One 8-GPU host, busy for 2 h: a job due in 3 h with 1 h of its own and 30 min
    after it should start within 1 h 30 min, is expected to start in 2 h: at risk, 30 min
    late, its cause kept. One due in 5 h waits for the GPUs as usual; one whose latest
    start has passed is at risk whatever its ETA."""
    eight = {"name": "w", "gpus": 8}
    for late_one in (False, True):
        s = _scheduler()
        s.submit(job("busy", eight, expected_runtime=7200), 0.0)
        s.schedule(0.0)
        s.submit(job("tight", eight, expected_runtime=3600, downstream="30m"), 0.0,
                 deadline=3 * 3600.0)
        s.submit(job("easy", eight, expected_runtime=3600), 0.0, deadline=5 * 3600.0)
        if late_one:
            s.submit(job("gone", eight, expected_runtime=600), 0.0, deadline=600.0)
        pending = s.schedule(60.0, explain=True).pending
        if late_one:
            gone = pending["gone"]
            assert gone.code == "DeadlineAtRisk" and "should have started 1m ago" in \
                gone.message, gone
            continue
        tight = pending["tight"]
        assert tight.code == "DeadlineAtRisk", tight
        assert tight.details["cause"] in ("Resources", "Priority")
        assert tight.details["latest_start"] == 3 * 3600 - 3600 - 1800
        assert tight.details["expected_late_s"] == 7200 - (3 * 3600 - 3600 - 1800)
        assert "deadline at risk: its pipeline is due in 2h59m" in tight.message, tight
        assert "so it should start in 1h29m" in tight.message
        assert "about 30m late" in tight.message
        assert pending["easy"].code != "DeadlineAtRisk", pending["easy"]
