"""The example DAGs import cleanly, and `airflow-gpu demo` (what `make demo` runs) takes
the example pipeline through real Airflow on the simulated cluster."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


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


def test_demo_runs_the_pipeline_through_airflow():
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "demo"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "outcome: DAG run success" in out.stdout
    for task in ("etl", "train_tensorflow", "train_pytorch", "validate"):
        assert f"task {task}" in out.stdout
    # every replica printed its grant, e.g. "[worker-9] worker-9 on dgx-h-02: GPUs [1] ..."
    lines = [x for x in out.stdout.splitlines() if "] worker-" in x and " GPUs [" in x]
    assert len(lines) == 12                     # 10 TensorFlow + 2 PyTorch workers
    assert "Placements" in out.stdout
