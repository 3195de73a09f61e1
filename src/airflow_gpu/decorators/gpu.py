"""`@task.gpu`: a Python callable run in a child process on the granted GPUs and cores.

    @task.gpu(gpus=1, cpus=4, memory="16GiB", job_class="validation")
    def evaluate(model_path):
        import torch ...          # sees only its GPUs (CUDA_VISIBLE_DEVICES)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import Context, conf
from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from ..launch.handle import Handle
from ..launch.local import local_host, refuse_other_hosts, start_callable
from ..launch.replica import Replica
from ..operators.base import GpuBaseOperator


class GpuPythonOperator(GpuBaseOperator):
    """Runs `python_callable(*op_args, **op_kwargs)` in a forked child with the grant's
    isolation; its return value is the task's return value (XCom). A replica granted on
    another host than this machine (`[gpu_scheduler] local_host`) fails the task."""

    template_fields: Sequence[str] = ("op_args", "op_kwargs", "expected_runtime", "time_limit",
                                      "deadline")
    starts_here = True

    def __init__(self, *, python_callable: Callable, op_args: Sequence | None = None,
                 op_kwargs: dict | None = None, strict_isolation: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.python_callable = python_callable
        self.op_args, self.op_kwargs = list(op_args or []), dict(op_kwargs or {})
        self.strict_isolation = strict_isolation

    def _launch(self, context: Context, replicas: list[Replica],
                started: list[Handle]) -> None:
        refuse_other_hosts(replicas, local_host(conf.get("gpu_scheduler", "local_host",
                                                         fallback="")))
        for r in replicas:
            handle, warnings = start_callable(r, self.python_callable, tuple(self.op_args),
                                              self.op_kwargs, {}, self.strict_isolation)
            self._warn(r, warnings)
            started.append(handle)

    def _result(self, replicas: list[Replica]) -> Any:
        return self._handles[0].value if self._handles else None


class _GpuDecoratedOperator(DecoratedOperator, GpuPythonOperator):
    custom_operator_name = "@task.gpu"

    def __init__(self, *, python_callable, op_args, op_kwargs, **kwargs) -> None:
        super().__init__(kwargs_to_upstream={"python_callable": python_callable,
                                             "op_args": op_args, "op_kwargs": op_kwargs},
                         python_callable=python_callable, op_args=op_args,
                         op_kwargs=op_kwargs, **kwargs)


def gpu_task(python_callable: Callable | None = None, multiple_outputs: bool | None = None,
             **kwargs):
    """The `@task.gpu` decorator; takes GpuBaseOperator's resource arguments."""
    return task_decorator_factory(python_callable=python_callable,
                                  multiple_outputs=multiple_outputs,
                                  decorated_operator_class=_GpuDecoratedOperator, **kwargs)
