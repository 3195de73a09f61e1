"""Run one DAG with `dag.test()` (real Airflow, in this process) and print each task
instance's state as the last line, as JSON. The tests start it as a subprocess, so that
Airflow reads the AIRFLOW_HOME and connection they set up."""

from __future__ import annotations

import importlib.util
import json
import sys


def returned(dag_id: str, run_id: str) -> dict:
    """Each task's return value (XCom `return_value`)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        rows = s.scalars(select(XComModel).where(XComModel.dag_id == dag_id,
                                                 XComModel.run_id == run_id,
                                                 XComModel.key == "return_value"))
        return {r.task_id: XComModel.deserialize_value(r) for r in rows}


def main(path: str, dag_id: str, conf: str = "{}") -> int:
    spec = importlib.util.spec_from_file_location("dag_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = getattr(module, "dag", None) or next(
        v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id)
    run = dag.test(run_conf=json.loads(conf))
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print("DAG-RESULT " + json.dumps({"state": str(run.state), "tasks": states,
                                      "returned": returned(dag.dag_id, run.run_id)},
                                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
