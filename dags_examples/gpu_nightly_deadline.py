"""A nightly retrain that must be done by 6 am: queued at midnight with a DeadlineAlert of
6 hours. Each GPU task sends the scheduler the run's deadline and the GPU work still to
run after it, so the scheduler knows how late each job may start (docs/airflow.md,
"Deadlines"). The alert's callback mails the on-call if the run is late all the same.

AIRFLOW_GPU_EXAMPLE_RUNNER=local runs the replicas as local processes instead of
containers, AIRFLOW_GPU_EXAMPLE_WORK replaces each command (e.g. with `sleep 1`).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.providers.smtp.notifications.smtp import SmtpNotifier
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, AsyncCallback, DeadlineAlert, DeadlineReference

from airflow_gpu.operators.gang import GpuGangOperator

RUNNER = os.environ.get("AIRFLOW_GPU_EXAMPLE_RUNNER", "docker")
WORK = os.environ.get("AIRFLOW_GPU_EXAMPLE_WORK")
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def run(command: str):
    return ["sh", "-c", WORK or command] if RUNNER == "docker" else WORK or command


with DAG(
    dag_id="gpu_nightly_deadline",
    schedule="0 0 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["gpu", "example"],
    default_args={"runner": RUNNER, "image": IMAGE, "team": "vision"},
    # done by 6 am: 6 hours after the run is queued at midnight
    deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(hours=6),
        callback=AsyncCallback(SmtpNotifier, kwargs={
            "to": "ml-oncall@example.com",
            "subject": "gpu_nightly_deadline missed its 6 am deadline"})),
) as dag:
    # downstream of prepare: train (4h) -> validate (30m); report is not a GPU task
    prepare = GpuGangOperator(task_id="prepare", job_class="validation", gpus=1, cpus=4,
                              memory="16GiB", expected_runtime="20m",
                              command=run("python prepare.py"))
    train = GpuGangOperator(task_id="train", job_class="pytorch", gpus=8, cpus=32,
                            memory="256GiB", expected_runtime="4h",
                            command=run("torchrun --nproc-per-node=8 train.py"))
    # the evaluation report is due by 5:30 for the morning review: it tightens the DAG's
    # deadline for this task alone (the earlier of the two wins)
    validate = GpuGangOperator(task_id="validate", job_class="validation", gpus=1,
                               cpus=4, memory="16GiB", expected_runtime="30m",
                               deadline=timedelta(hours=5, minutes=30),
                               command=run("python validate.py"))
    report = EmptyOperator(task_id="report")
    prepare >> train >> validate >> report
