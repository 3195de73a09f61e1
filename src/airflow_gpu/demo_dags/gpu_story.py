"""The DAGs `airflow-gpu demo` runs: three teams sharing the built-in demo cluster (four
DGX hosts, 32 GPUs), each task a gang of local `sleep` processes (no GPU needed).

The demo triggers them in three waves (demo/story.py) so the same things happen on every
run: nlp's fine-tune holds two hosts; research's 32-GPU pretrain cannot start and gets a
reservation; then research's small eval backfills in front of it, vision's urgent
retrain (priority 50) arrives last and still goes first, and nlp's long sweep waits
deferred until the reserved gangs are done. Expected runtimes (what the scheduler plans
with) are longer than the sleeps, as estimates usually are.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_gpu.operators.gang import GpuGangOperator

# Seconds each task's replicas run; `airflow-gpu demo --speed` scales them.
SPEED = float(os.environ.get("AIRFLOW_GPU_DEMO_SPEED", "1"))
SHOW = ('echo "$AIRFLOW_GPU_ROLE-$AIRFLOW_GPU_REPLICA on $AIRFLOW_GPU_HOST: '
        'GPUs [$AIRFLOW_GPU_GPUS]"')


# The demo touches this file once wave 3's tasks wait (demo/story.py): the fine-tune
# holds its GPUs until then, so the story does not depend on how fast the machine is.
GATE = os.environ.get("AIRFLOW_GPU_DEMO_GATE")


def work(seconds: float, gated: bool = False) -> str:
    sleep = f"sleep {max(1, round(seconds * SPEED))}"
    if gated and GATE:
        return f"{SHOW}; {sleep}; while [ ! -e '{GATE}' ]; do sleep 0.5; done; sleep 3"
    return f"{SHOW}; {sleep}"


def team_dag(dag_id: str, team: str) -> DAG:
    return DAG(dag_id=dag_id, schedule=None, catchup=False, tags=["gpu", "demo"],
               start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
               default_args={"runner": "local", "team": team, "poll_interval": 1.0,
                             "gpu_scheduler_conn_id": f"gpu_scheduler_{team}",
                             "cpus": 4, "memory": "32GiB"})


def gang(task_id: str, hosts: int, seconds: float, gated: bool = False,
         **kwargs) -> GpuGangOperator:
    """`hosts` replicas of 8 GPUs: a whole DGX host each."""
    return GpuGangOperator(task_id=task_id, job_class="pytorch",
                           command=work(seconds, gated),
                           roles=[{"name": "worker", "replicas": hosts, "gpus": 8,
                                   "cpus": 16, "memory": "64GiB"}], **kwargs)


# Wave 1: nlp's fine-tune starts at once on an idle cluster (16 of 32 GPUs); it runs 15 s
# and until wave 3 waits, then 3 s more.
with team_dag("demo_nlp_finetune", "nlp") as finetune:
    gang("finetune", hosts=2, seconds=15, gated=True, priority=0, expected_runtime="90s")

# Wave 2: research's pretrain needs all 32 GPUs: it waits (deferred) with a reservation
# for when the fine-tune is expected to end.
with team_dag("demo_research_pretrain", "research") as pretrain:
    gang("pretrain", hosts=4, seconds=10, priority=0, expected_runtime="30s")

# Wave 3, all at once:
# - research's eval (2 GPUs, 15 s expected) ends before any reservation starts: it
#   backfills now, ahead of the reservation (it would yield there had it overrun);
with team_dag("demo_research_eval", "research") as evaluate:
    GpuGangOperator(task_id="eval", job_class="pytorch", gpus=2, priority=0,
                    expected_runtime="15s", command=work(4), priority_weight=10)

# - vision's retrain has priority 50: a higher band, so it goes before the pretrain that
#   has waited longer (priority_weight: Airflow hands it a worker slot first, too);
with team_dag("demo_vision_retrain", "vision") as retrain:
    gang("retrain", hosts=3, seconds=8, priority=50, expected_runtime="30s",
         priority_weight=10)

# - nlp's sweep (three 8-GPU trials, 5 min expected) fits in the free GPUs but would run
#   into the reservations: it waits, deferred, until the gangs are done.
with team_dag("demo_nlp_sweep", "nlp") as sweep:
    for trial in range(3):
        GpuGangOperator(task_id=f"trial_{trial}", job_class="pytorch", gpus=8, cpus=16,
                        memory="64GiB", priority=0, expected_runtime="5m",
                        command=work(5))
