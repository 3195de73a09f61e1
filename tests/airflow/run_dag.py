"""Run one DAG with `dag.test()` (real Airflow, in this process) and print each task
instance's state as the last line, as JSON. The tests start it as a subprocess, so that
Airflow reads the AIRFLOW_HOME and connection they set up."""

from __future__ import annotations

import importlib.util
import json
import sys


def main(path: str, dag_id: str, conf: str = "{}") -> int:
    spec = importlib.util.spec_from_file_location("dag_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = getattr(module, "dag", None) or next(
        v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id)
    run = dag.test(run_conf=json.loads(conf))
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print("DAG-RESULT " + json.dumps({"state": str(run.state), "tasks": states}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
