"""A GPU task's pipeline deadline: the DAG's DeadlineAlerts resolved for its run, the
task's `deadline=`, and the longest path of GPU work after it."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, DeadlineAlert, DeadlineReference, SyncCallback

from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.operators.deadlines import (
    Downstream,
    add_deadline,
    dag_due,
    due_of,
    longest_path,
    task_due,
)

QUEUED = datetime(2026, 12, 5, 4, 0, tzinfo=UTC)
LOGICAL = datetime(2026, 12, 4, 0, 0, tzinfo=UTC)
RUN = SimpleNamespace(start_date=QUEUED, logical_date=LOGICAL, run_after=LOGICAL)
LOG = logging.getLogger("test")


def notify(**_):
    pass


def alert(reference, hours: float) -> DeadlineAlert:
    return DeadlineAlert(reference=reference, interval=timedelta(hours=hours),
                         callback=SyncCallback(notify))


def dag_with(*alerts) -> DAG:
    return DAG("pipeline", schedule=None, deadline=list(alerts) or None)


def gpu(task_id: str, **kwargs) -> GpuBashOperator:
    return GpuBashOperator(task_id=task_id, bash_command="true", gpus=1, **kwargs)


def test_queued_at_plus_the_interval():
    due = dag_due(dag_with(alert(DeadlineReference.DAGRUN_QUEUED_AT, 2)), RUN, LOG)
    assert due.at == datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
    assert due.why == "DAG run's DeadlineAlert: queued_at + 2h"


def test_the_earliest_alert_wins_and_the_unreadable_ones_are_named(caplog):
    dag = dag_with(alert(DeadlineReference.DAGRUN_QUEUED_AT, 2),
                   alert(DeadlineReference.DAGRUN_LOGICAL_DATE, 30),
                   alert(DeadlineReference.FIXED_DATETIME(
                       datetime(2026, 12, 5, 7, 0, tzinfo=UTC)), -0.5),
                   alert(DeadlineReference.AVERAGE_RUNTIME(), 1))
    with caplog.at_level(logging.WARNING):
        due = dag_due(dag, RUN, LOG)
    assert due.at == datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
    assert due.why == "DAG run's DeadlineAlert: queued_at + 2h"
    assert [r.getMessage() for r in caplog.records] == [
        "the DAG's DeadlineAlert is not sent to the GPU scheduler: AverageRuntimeDeadline "
        "depends on Airflow's database, which a task cannot read"]
    fixed = dag_due(dag_with(alert(DeadlineReference.FIXED_DATETIME(
        datetime(2026, 12, 5, 7, 0, tzinfo=UTC)), -0.5)), RUN, LOG)
    assert (fixed.at, fixed.why) == (datetime(2026, 12, 5, 6, 30, tzinfo=UTC),
                                     "DAG run's DeadlineAlert: 2026-12-05T07:00Z - 30m")


def test_a_run_without_a_logical_date_skips_that_alert():
    run = SimpleNamespace(start_date=QUEUED, logical_date=None)
    assert dag_due(dag_with(alert(DeadlineReference.DAGRUN_LOGICAL_DATE, 1)), run,
                   LOG) is None
    assert dag_due(dag_with(), run, LOG) is None


def test_queued_at_itself_where_the_run_carries_it():
    run = SimpleNamespace(queued_at=QUEUED - timedelta(minutes=5), start_date=QUEUED)
    due = dag_due(dag_with(alert(DeadlineReference.DAGRUN_QUEUED_AT, 1)), run, LOG)
    assert due.at == datetime(2026, 12, 5, 4, 55, tzinfo=UTC)


@pytest.mark.parametrize("value, at", [
    ("2026-12-05T05:00:00Z", datetime(2026, 12, 5, 5, 0, tzinfo=UTC)),
    (datetime(2026, 12, 5, 6, 0, tzinfo=UTC), datetime(2026, 12, 5, 6, 0, tzinfo=UTC)),
    (timedelta(minutes=90), datetime(2026, 12, 5, 5, 30, tzinfo=UTC)),
    ("1h", datetime(2026, 12, 5, 5, 0, tzinfo=UTC)),
])
def test_the_task_argument(value, at):
    assert task_due(value, RUN).at == at


def test_the_task_argument_tightens_the_dags_and_never_loosens_it():
    dag = dag_with(alert(DeadlineReference.DAGRUN_QUEUED_AT, 2))
    with dag:
        tight, loose = gpu("tight", deadline="1h"), gpu("loose", deadline="3h")
    # a run queued now: a deadline already passed is not sent (below)
    context = {"dag": dag, "dag_run": SimpleNamespace(start_date=datetime.now(UTC))}
    assert due_of(tight, context, LOG).why == "the task's deadline=: queued_at + 1h"
    assert due_of(loose, context, LOG).why == "DAG run's DeadlineAlert: queued_at + 2h"


def test_a_bad_deadline_fails_when_the_dag_is_parsed():
    with pytest.raises(ValueError, match="has no time zone"):
        gpu("t", deadline="2026-12-05T06:00:00")
    with pytest.raises(ValueError, match="a duration after the DAG run was queued"):
        gpu("t", deadline="tomorrow")
    gpu("t", deadline="{{ dag_run.conf['due'] }}")       # rendered when the task runs


def pipeline() -> DAG:
    """prepare (GPU) -> [train (GPU 1h), report (not GPU)]; train -> export (not GPU)
    -> validate (GPU 30m); report -> publish (GPU 10m)."""
    with DAG("pipeline", schedule=None) as dag:
        prepare = gpu("prepare", expected_runtime="20m")
        train = gpu("train", expected_runtime="1h")
        report, export = EmptyOperator(task_id="report"), EmptyOperator(task_id="export")
        validate = gpu("validate", expected_runtime="30m")
        publish = gpu("publish", expected_runtime="10m")
        prepare >> [train, report]
        train >> export >> validate
        report >> publish
        train >> publish
    return dag


def test_the_longest_path_of_gpu_tasks_walks_through_the_others():
    dag = pipeline()
    seconds, path = Downstream(dag.task_dict["prepare"], None, "pipeline", LOG).result()
    assert (seconds, path) == (5400, ["train", "validate"])
    assert Downstream(dag.task_dict["train"], None, "pipeline", LOG).result() == (
        1800, ["validate"])
    assert Downstream(dag.task_dict["validate"], None, "pipeline", LOG).result() == (0, [])


def test_each_task_is_costed_once_however_many_paths_reach_it():
    dag = pipeline()
    costed = []

    def cost(t):
        costed.append(t.task_id)
        return 60.0
    assert longest_path(dag.task_dict["prepare"], cost)[0] == 180
    assert sorted(costed) == ["export", "publish", "report", "train", "validate"]


class History:
    """A scheduler client whose history has one 40-minute run of pipeline.validate."""

    def __init__(self):
        self.names = []

    def jobs(self, name, **_):
        self.names.append(name)
        return [{"started_at": "2026-12-01T00:00:00+00:00",
                 "finished_at": "2026-12-01T00:40:00+00:00"}] if name.endswith("validate") \
            else []


def test_downstream_tasks_without_expected_runtime_read_their_history_once_each():
    with DAG("pipeline", schedule=None):
        first = gpu("first")
        middle = gpu("middle", job_class="validation")    # no history: the class's 30m
        last = gpu("validate")
        first >> middle >> last
    client = History()
    assert Downstream(first, client, "pipeline", LOG).result() == (
        4200, ["middle", "validate"])
    assert sorted(client.names) == ["pipeline.middle", "pipeline.validate"]


def test_mapped_gpu_tasks_count_once_at_their_expected_runtime():
    with DAG("pipeline", schedule=None):
        first = gpu("first")
        sweep = GpuBashOperator.partial(task_id="sweep", gpus=1, expected_runtime="15m"
                                        ).expand(bash_command=["true", "false"])
        first >> sweep
    assert Downstream(first, None, "pipeline", LOG).result() == (900, ["sweep"])


def test_the_log_line_says_what_was_sent(caplog):
    due = task_due("2026-12-05T06:00:00Z", RUN)
    with caplog.at_level(logging.INFO):
        spec = add_deadline({"name": "x"}, due, (5400.0, ["train", "validate"]), 1800, LOG)
    assert spec == {"name": "x", "deadline": "2026-12-05T06:00:00+00:00",
                    "downstream": 5400}
    assert caplog.records[-1].getMessage() == (
        "deadline 2026-12-05T06:00Z (the task's deadline=), downstream 1h30m (train -> "
        "validate): latest start 2026-12-05T04:00Z (this job's runtime 30m)")


def test_a_task_without_a_deadline_sends_none_and_reads_nothing_more(monkeypatch):
    from tests.operators.test_submit_overlap import Client, Conn, TaskInstance

    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", "*")
    now = SimpleNamespace(start_date=datetime.now(UTC).replace(microsecond=0))  # queued now
    for alerts, calls in (((), ["jobs", "submit"]),
                          ((alert(DeadlineReference.DAGRUN_QUEUED_AT, 2),),
                           ["jobs", "jobs", "submit"])):
        with dag_with(*alerts) as dag:
            first, second = gpu("t"), gpu("second")
            first >> second
        client = Client()
        first._client, first._connection = client, Conn()
        monkeypatch.setattr(first, "_run", lambda context, job: job["state"])
        assert first._submit({"ti": TaskInstance(), "dag": dag, "dag_run": now}) == "running"
        assert client.calls[:-2] == calls           # the history: this task's, then second's
        assert ("deadline" in client.spec) == bool(alerts)
    assert client.spec["deadline"] == (now.start_date + timedelta(hours=2)).isoformat()
    assert client.spec["downstream"] == 0          # second has no estimate at all


def test_a_deadline_already_passed_is_not_sent(monkeypatch, capsys):
    """The scheduler refuses a deadline in the past (a late DAG run's): the task sends
    its job without one, and says so, rather than failing."""
    from tests.operators.test_submit_overlap import Client, Conn, TaskInstance

    monkeypatch.setenv("AIRFLOW__GPU_SCHEDULER__LOCAL_HOST", "*")
    late = SimpleNamespace(start_date=datetime.now(UTC) - timedelta(hours=3))
    with dag_with(alert(DeadlineReference.DAGRUN_QUEUED_AT, 2)) as dag:
        first, second = gpu("t", expected_runtime="1h"), gpu("second", expected_runtime="1h")
        first >> second
    client = Client()
    first._client, first._connection = client, Conn()
    monkeypatch.setattr(first, "_run", lambda context, job: job["state"])
    assert first._submit({"ti": TaskInstance(), "dag": dag, "dag_run": late}) == "running"
    assert "deadline" not in client.spec and "downstream" not in client.spec
    said = capsys.readouterr()                    # the task's log (structlog's output)
    assert "has passed: the GPU job is sent without a deadline" in said.out + said.err
