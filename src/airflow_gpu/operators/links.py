"""The "GPU job" button on a GPU task instance: opens the plugin's job page (placement,
events, why it waits) inside the Airflow UI."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

JOB_ID_XCOM = "gpu_job_id"           # pushed by GpuBaseOperator when it submits
PLUGIN_PAGE = "/plugin/gpu_cluster"  # the plugin's view in the Airflow UI (url_route)
PLUGIN_APP = "/gpu"                  # where the plugin's app is mounted


def job_page_url(job_id: str, base_path: str = "") -> str:
    """The job page framed by the Airflow UI (Airflow 3.3 keeps the frame's path after
    /plugin/<route>), under the API server's base path."""
    return f"{base_path}{PLUGIN_PAGE}{PLUGIN_APP}/jobs/{quote(job_id, safe='')}"


def _base_path() -> str:
    from airflow.configuration import conf

    return urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")


class GpuJobLink(BaseOperatorLink):
    name = "GPU job"

    def get_link(self, operator, *, ti_key) -> str:
        # Evaluated on the worker when the task ends or defers, so a task waiting for
        # admission already has the button. No job yet: no link (an empty string).
        from airflow.sdk.execution_time.xcom import XCom

        job_id = XCom.get_value(ti_key=ti_key, key=JOB_ID_XCOM)
        return job_page_url(str(job_id), _base_path()) if job_id else ""
