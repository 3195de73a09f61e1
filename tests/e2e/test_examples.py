"""The example DAGs (and the demo's, test_demo_story.py runs them) import cleanly, and
the example pipeline runs through Airflow (`dag.test()`, local processes) on the built-in
demo cluster."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.e2e.conftest import airflow_env, create_token
from tests.helpers import REPO
from tests.servers import Server


def test_example_dags_import_without_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags_examples"))
    assert bag.import_errors == {}
    dag = bag.dags["gpu_training_pipeline"]
    assert sorted(dag.task_dict) == ["etl", "train_pytorch", "train_tensorflow", "validate"]
    tf = dag.task_dict["train_tensorflow"]
    assert [(r["name"], r["replicas"]) for r in tf.roles] == [("ps", 2), ("worker", 10)]
    assert tf.framework == "tensorflow-ps"
    assert dag.task_dict["train_pytorch"].framework == "pytorch"
    assert set(dag.task_dict["validate"].upstream_task_ids) == {"train_tensorflow",
                                                               "train_pytorch"}
    nightly = bag.dags["gpu_nightly_deadline"]
    assert [type(a.reference).__name__ for a in nightly.deadline] == [
        "DagRunQueuedAtDeadline"]
    assert nightly.task_dict["validate"].deadline.total_seconds() == 5.5 * 3600


def test_demo_dags_import_without_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "src" / "airflow_gpu" / "demo_dags"))
    assert bag.import_errors == {}
    assert sorted(bag.dags) == ["demo_nlp_finetune", "demo_nlp_sweep", "demo_research_eval",
                                "demo_research_pretrain", "demo_vision_retrain"]
    assert bag.dags["demo_research_pretrain"].task_dict["pretrain"].roles[0]["replicas"] == 4


def test_example_pipeline_runs_through_airflow(airflow_home, tmp_path):
    server = Server(f"sqlite:///{tmp_path}/scheduler.db", "demo", interval=0.2,
                    log=tmp_path / "server.log")
    try:
        conn = json.dumps({"conn_type": "gpu_scheduler", "host": "127.0.0.1",
                           "port": server.port, "password": create_token(server.db, "vision")})
        out = subprocess.run(
            [sys.executable, "-m", "airflow_gpu.demo", "--dag-test",
             str(REPO / "dags_examples" / "gpu_training_pipeline.py"), "gpu_training_pipeline"],
            cwd=REPO, capture_output=True, text=True, timeout=300, env=airflow_env(
                airflow_home, AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT=conn,
                AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags_examples"),
                AIRFLOW_GPU_EXAMPLE_RUNNER="local", AIRFLOW_GPU_EXAMPLE_WORK="sleep 1"))
    finally:
        server.stop()
    lines = [x for x in out.stdout.splitlines() if x.startswith("DAG-RESULT ")]
    assert lines, out.stdout[-4000:] + out.stderr[-2000:]
    result = json.loads(lines[-1].removeprefix("DAG-RESULT "))
    assert result["state"] == "success", result
    assert set(result["tasks"].values()) == {"success"}
    # every GPU worker got its own grant: 10 TensorFlow workers and 2 PyTorch workers
    workers = [r for task in ("train_tensorflow", "train_pytorch")
               for r in result["returned"][task]["replicas"] if r["role"] == "worker"]
    assert len(workers) == 12 and all(r["gpus"] for r in workers)
