"""`python -m airflow_gpu.demo --dag-test DAG_FILE DAG_ID [CONF_JSON]`: one DAG run with
`dag.test()` in this process (the e2e tests use it)."""

from __future__ import annotations

import importlib.util
import json

RESULT = "DAG-RESULT "


def dag_test(path: str, dag_id: str, conf: str = "{}") -> int:
    """Run one DAG with `dag.test()` in this process; the last line printed is
    `DAG-RESULT {"state", "tasks": {task: state}, "returned": {task: XCom}}`."""
    spec = importlib.util.spec_from_file_location("dag_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = next(v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id)
    run = dag.test(run_conf=json.loads(conf))
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print(RESULT + json.dumps({"state": str(run.state), "tasks": states,
                               "returned": _returned(dag_id, run.run_id)}, default=str),
          flush=True)
    return 0


def _returned(dag_id: str, run_id: str) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        rows = s.scalars(select(XComModel).where(XComModel.dag_id == dag_id,
                                                 XComModel.run_id == run_id,
                                                 XComModel.key == "return_value"))
        return {r.task_id: XComModel.deserialize_value(r) for r in rows}
