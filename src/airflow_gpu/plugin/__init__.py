"""The Airflow UI plugin: the GPU cluster, the queue and why a task waits, inside Airflow.

Registered only through the `airflow.plugins` entry point (naming it in the provider info
as well makes it load twice when providers are discovered eagerly)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from .app import create_app

URL_PREFIX = "/gpu"
URL_ROUTE = "gpu_cluster"      # the page inside the Airflow UI: /plugin/gpu_cluster


class GpuPlugin(AirflowPlugin):
    name = "gpu"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX,
                     "name": "GPU cluster (airflow-provider-gpu)"}]
    external_views = [{"name": "GPU cluster", "href": f"{URL_PREFIX}/",
                       "url_route": URL_ROUTE, "destination": "nav", "category": "browse"}]
