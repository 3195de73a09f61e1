"""The "GPU job" extra link, end to end: a real task run (`dag.test()` in the API server's
Airflow home) submits a job, its instance gets the link, the Airflow UI shows it, and it
opens the job page, which links back to the same task instance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx

DAG_FILE = Path(__file__).parent / "dags" / "gpu_link.py"


def test_task_instance_extra_link_opens_its_job_page(stack, browser):
    conn = json.loads(stack.scheduler.connection())
    conn["password"] = stack.scheduler.tokens["vision"]
    run = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; dag = runpy.run_path(sys.argv[1])['dag'];"
         " print('RUN-ID', dag.test().run_id)", str(DAG_FILE)],
        env={**stack.airflow.env, "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
             "AIRFLOW_CONN_GPU_SCHEDULER_DEFAULT": json.dumps(conn),
             # the demo's hosts are simulated: this machine may act as any of them
             "AIRFLOW__GPU_SCHEDULER__LOCAL_HOST": "*"},
        capture_output=True, text=True, timeout=240)
    ids = [x.split()[1] for x in run.stdout.splitlines() if x.startswith("RUN-ID ")]
    assert ids, f"dag.test() did not run:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    run_id = ids[0]
    (job,) = stack.scheduler.call("GET", "/api/v1/jobs", params={"name": "gpu_link.evaluate"})
    assert job["idempotency_key"] == f"gpu_link/evaluate/{run_id}/-1/1"

    # the API server serves the link the worker stored when the task ended
    links = httpx.get(
        f"{stack.url}/api/v2/dags/gpu_link/dagRuns/{run_id}/taskInstances/evaluate/links",
        headers={"Authorization": f"Bearer {stack.airflow.token()}"}, timeout=30).json()
    assert links["extra_links"] == {"GPU job": f"/plugin/gpu_cluster/gpu/jobs/{job['id']}"}

    ti_path = f"/dags/gpu_link/runs/{quote(run_id, safe='')}/tasks/evaluate"
    browser.open(f"{stack.url}{ti_path}/details")
    link = "[...document.querySelectorAll('a')].find(a => a.innerText.trim() === 'GPU job')"
    browser.wait(link, what="the GPU job button on the task instance")
    browser.eval(f"{link}.click()")
    browser.wait(f"location.pathname === '/plugin/gpu_cluster/gpu/jobs/{job['id']}'")
    frame = "document.querySelector('iframe').contentDocument"
    browser.wait(f"{frame} && {frame}.querySelector('#ti-link')", what="the job page")
    assert browser.eval(f"{frame}.querySelector('#job-name').innerText") == \
        "gpu_link.evaluate"
    assert browser.eval(f"{frame}.querySelector('#ti-link').getAttribute('href')") == ti_path
