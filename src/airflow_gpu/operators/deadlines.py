"""A GPU task's pipeline deadline: when its DAG run must be done (the DAG's DeadlineAlerts
and the task's `deadline=`), and the GPU work still to run after it (`downstream`), as the
job spec's `deadline` and `downstream` (docs/airflow.md, "Deadlines").

Without a deadline nothing here calls anything: a DAG's `deadline` attribute is read, and
that is all. With one, each downstream GPU task without `expected_runtime` costs one
history lookup; they run in parallel, beside the task's own."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..scheduler_core.units import format_duration, parse_deadline, parse_duration
from .request import job_name, runtime_from_history

LOOKUPS = 8             # downstream history lookups at once


@dataclass(frozen=True)
class Due:
    at: datetime        # aware
    why: str            # "DAG run's DeadlineAlert: queued_at + 2h"


def stamp(t: datetime) -> str:
    """2026-12-05T06:00Z: UTC, seconds only where there are some."""
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ" if t.second else "%Y-%m-%dT%H:%MZ")


def run_start(dag_run) -> tuple[datetime | None, str]:
    """When the DAG run was queued. A task's context carries no queued_at in Airflow 3.3
    (the Execution API's DagRun lacks it): its start, the moment the run left the queue,
    stands in; it is later only by the time the run waited queued (max_active_runs)."""
    for attr in ("queued_at", "start_date", "run_after"):
        value = getattr(dag_run, attr, None)
        if value is not None:
            return value, attr
    return None, "queued_at"


# -- the DAG's DeadlineAlerts ---------------------------------------------------------------
def alerts_of(dag) -> list:
    """The DAG's DeadlineAlerts: `dag.deadline` is a list once the DAG is built (the SDK
    converts one alert into a list of one), a single alert or None on other objects."""
    alerts = getattr(dag, "deadline", None)
    if alerts is None:
        return []
    return list(alerts) if isinstance(alerts, list | tuple) else [alerts]


def _kind(reference) -> str:
    """The reference's type name, as Airflow serializes it (SDK and core classes alike)."""
    if isinstance(reference, dict):
        return str(reference.get("reference_type", "?"))
    try:
        return str(reference.serialize_reference()["reference_type"])
    except (AttributeError, KeyError, TypeError):
        return type(reference).__name__


def _interval(interval) -> timedelta:
    if isinstance(interval, timedelta):
        return interval
    if isinstance(interval, int | float):            # seconds, as it is serialized
        return timedelta(seconds=interval)
    key = getattr(interval, "key", None)
    if key is not None:                              # VariableInterval: one Variable read
        from airflow.sdk import Variable

        return timedelta(seconds=int(Variable.get(key)))
    raise ValueError(f"an interval Airflow does not document: {interval!r}")


def alert_due(alert, dag_run) -> Due:
    """One alert's time for this DAG run; ValueError saying why it cannot be read here."""
    reference = getattr(alert, "reference", None) if not isinstance(alert, dict) \
        else alert.get("reference")
    kind = _kind(reference)
    interval = _interval(alert.get("interval") if isinstance(alert, dict) else alert.interval)
    if kind == "DagRunQueuedAtDeadline":
        base, attr = run_start(dag_run)
        label = "queued_at" if attr in ("queued_at", "start_date") else attr
    elif kind == "DagRunLogicalDateDeadline":
        base, label = getattr(dag_run, "logical_date", None), "logical_date"
    elif kind == "FixedDatetimeDeadline":
        base = (reference.get("datetime") if isinstance(reference, dict)
                else getattr(reference, "_datetime", None))
        if isinstance(base, int | float):
            base = datetime.fromtimestamp(base, UTC)
        label = stamp(base) if base else "a fixed time"
    else:
        raise ValueError(f"{kind} depends on Airflow's database, which a task cannot read")
    if base is None:
        raise ValueError(f"this DAG run has no {label}")
    sign = "-" if interval < timedelta(0) else "+"
    length = format_duration(abs(interval).total_seconds())
    return Due(parse_deadline(base) + interval,
               f"DAG run's DeadlineAlert: {label} {sign} {length}")


def dag_due(dag, dag_run, log) -> Due | None:
    """The earliest of the DAG's DeadlineAlerts this task can resolve; each one it
    cannot is named in the log once (this task's run)."""
    found = []
    for alert in alerts_of(dag):
        try:
            found.append(alert_due(alert, dag_run))
        except (ValueError, TypeError, LookupError) as exc:
            log.warning("the DAG's DeadlineAlert is not sent to the GPU scheduler: %s", exc)
    return min(found, key=lambda d: d.at, default=None)


# -- the task's deadline= -----------------------------------------------------------------
def check_deadline(value) -> None:
    """At parse time: a value that will never be a deadline fails the DAG's import."""
    if value is None or isinstance(value, timedelta) or (
            isinstance(value, str) and "{{" in value):       # rendered when the task runs
        return
    task_due(value, None)


def task_due(value, dag_run) -> Due | None:
    """`deadline=` as rendered: an aware datetime or ISO string, or a duration (timedelta,
    "2h") after the DAG run was queued."""
    if value is None or value == "":
        return None
    relative = value if isinstance(value, timedelta) else None
    if isinstance(value, str):
        with contextlib.suppress(ValueError):         # else a date and time
            relative = timedelta(seconds=parse_duration(value))
    if relative is None:
        try:
            return Due(parse_deadline(value), "the task's deadline=")
        except ValueError as exc:
            raise ValueError(f"deadline: {exc}; or a duration after the DAG run was "
                             "queued, such as 2h") from None
    if dag_run is None:
        return None
    base, _ = run_start(dag_run)
    if base is None:
        raise ValueError("deadline: a duration needs the DAG run's queued_at")
    return Due(parse_deadline(base) + relative,
               f"the task's deadline=: queued_at + {format_duration(relative.total_seconds())}")


def due_of(task, context, log) -> Due | None:
    """The earlier of the DAG's deadline and the task's `deadline=`; None without both."""
    run = context.get("dag_run")
    dag = context.get("dag") or (task.dag if task.has_dag() else None)
    found = [d for d in (dag_due(dag, run, log), task_due(task.deadline, run)) if d]
    due = min(found, key=lambda d: d.at, default=None)
    if due is not None and due.at <= datetime.now(UTC):
        # the scheduler refuses a deadline in the past: the run is late already, and no
        # order of the queue can make it on time; the job goes as one without a deadline
        log.warning("deadline %s (%s) has passed: the GPU job is sent without a deadline "
                    "(the DAG run is late; its DeadlineAlert's callback is Airflow's)",
                    stamp(due.at), due.why)
        return None
    return due


# -- the work after this task -------------------------------------------------------------
def gpu_fields(task) -> dict[str, Any] | None:
    """A GPU task's estimate fields (mapped tasks: their partial arguments); None for
    other tasks. A GPU operator's class says it is one (`gpu_task`, base.py)."""
    if getattr(type(task), "gpu_task", False):
        return {k: getattr(task, k, None) for k in ("expected_runtime", "job_class",
                                                     "time_limit")}
    cls = getattr(task, "operator_class", None)
    if isinstance(cls, type) and getattr(cls, "gpu_task", False):
        kwargs = getattr(task, "partial_kwargs", {}) or {}
        return {k: kwargs.get(k) for k in ("expected_runtime", "job_class", "time_limit")}
    return None


def longest_path(task, cost: Callable[[Any], float]) -> tuple[float, list[str]]:
    """The longest chain of tasks after `task` (not counting it), by `cost` per task (0
    for tasks that are not GPU tasks, walked through all the same): its seconds and its
    GPU tasks' ids. Each task is costed once, however many paths reach it."""
    best: dict[str, tuple[float, list[str]]] = {}

    def after(t) -> tuple[float, list[str]]:
        options = [through(d) for d in t.downstream_list]
        return max(options, key=lambda o: o[0], default=(0.0, []))

    def through(t) -> tuple[float, list[str]]:
        if t.task_id not in best:
            seconds, path = after(t)
            own = cost(t)
            best[t.task_id] = (own + seconds, ([t.task_id] if own > 0 or
                                               gpu_fields(t) is not None else []) + path)
        return best[t.task_id]

    return after(task)


def estimate(fields: dict, client, name: str) -> float:
    """What the scheduler would plan a task at, as far as a task can tell: its
    expected_runtime, else its history, else its job class's; never over its time limit
    (0 when nothing is known: the scheduler's default is its own)."""
    from ..scheduler_core.plugins import default_registry

    seconds = None
    try:
        if fields.get("expected_runtime"):
            seconds = parse_duration(fields["expected_runtime"])
    except ValueError:          # a template, rendered only when that task runs
        pass
    if seconds is None and client is not None:
        seconds = runtime_from_history(client, name, fields.get("job_class"),
                                       fields.get("time_limit"), _Quiet())
    if seconds is None:
        jc = default_registry().job_classes.get(fields.get("job_class") or "")
        seconds = jc.default_runtime if jc is not None else None
    limit = fields.get("time_limit")
    try:
        if seconds is not None and limit:
            seconds = min(seconds, parse_duration(limit))
    except ValueError:
        pass
    return float(seconds or 0)


class _Quiet:
    """A log for another task's history lookup: its line belongs in that task's log."""

    def info(self, *args, **kwargs) -> None:
        pass


class Downstream:
    """The downstream path, its history lookups started at once on threads of their own
    (the task's own submit goes on meanwhile); `result()` waits for them."""

    def __init__(self, task, client, dag_id: str, log):
        self._task, self._log = task, log
        tasks: dict[str, Any] = {}
        stack = list(task.downstream_list)
        while stack:
            t = stack.pop()
            if t.task_id not in tasks:
                tasks[t.task_id] = t
                stack.extend(t.downstream_list)
        gpu = {tid: f for tid, t in tasks.items() if (f := gpu_fields(t)) is not None}
        self._pool = ThreadPoolExecutor(min(LOOKUPS, len(gpu) or 1),
                                        thread_name_prefix="downstream")
        self._futures = {tid: self._pool.submit(estimate, f, client, job_name(dag_id, tid))
                         for tid, f in gpu.items()}

    def result(self) -> tuple[float, list[str]]:
        costs = {}
        for tid, future in self._futures.items():
            try:
                costs[tid] = future.result()
            except Exception as exc:     # a missing estimate must not fail the task
                self._log.warning("downstream task %s counted 0: its runtime history "
                                  "could not be read (%s)", tid, exc)
        self._pool.shutdown(wait=False)
        return longest_path(self._task, lambda t: costs.get(t.task_id, 0.0))


def add_deadline(spec: dict, due: Due, downstream: tuple[float, list[str]],
                 own: float, log) -> dict:
    """The spec with `deadline` and `downstream`; the task log says what was sent."""
    seconds, path = downstream
    spec = {**spec, "deadline": due.at.isoformat(), "downstream": int(round(seconds))}
    latest = due.at - timedelta(seconds=own + seconds)
    log.info("deadline %s (%s), downstream %s (%s): latest start %s%s",
             stamp(due.at), due.why, format_duration(seconds),
             " -> ".join(path) or "no GPU task after this one", stamp(latest),
             f" (this job's runtime {format_duration(own)})" if own else
             " less this job's runtime (the scheduler's default)")
    return spec
