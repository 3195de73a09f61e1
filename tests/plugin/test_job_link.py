"""The operator extra link and the plugin's registration, without a server."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from airflow.sdk import DAG

from airflow_gpu.operators import links
from airflow_gpu.operators.bash import GpuBashOperator
from airflow_gpu.operators.links import GpuJobLink, job_page_url
from airflow_gpu.provider_info import PROVIDER_INFO


class Key:
    dag_id, task_id, run_id, map_index = "d", "t", "manual__1", -1


@pytest.fixture
def xcom(monkeypatch):
    stored: dict[str, object] = {}

    def get_value(*, ti_key, key):
        assert (ti_key.dag_id, ti_key.task_id) == ("d", "t")
        return stored.get(key)

    from airflow.sdk.execution_time.xcom import XCom

    monkeypatch.setattr(XCom, "get_value", staticmethod(get_value))
    return stored


def test_link_reads_the_job_id_pushed_by_the_operator(xcom):
    xcom["gpu_job_id"] = "0b5e-42"
    assert GpuJobLink().get_link(None, ti_key=Key()) == "/plugin/gpu_cluster/gpu/jobs/0b5e-42"


def test_no_job_yet_means_no_link(xcom):
    assert GpuJobLink().get_link(None, ti_key=Key()) == ""


def test_link_follows_the_api_server_base_path(xcom, monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/ml/")
    xcom["gpu_job_id"] = "j1"
    assert GpuJobLink().get_link(None, ti_key=Key()) == "/ml/plugin/gpu_cluster/gpu/jobs/j1"
    assert job_page_url("a/b") == "/plugin/gpu_cluster/gpu/jobs/a%2Fb"


def test_gpu_operators_carry_the_link_through_serialization():
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("d", schedule=None) as dag:
        GpuBashOperator(task_id="t", bash_command="true", gpus=1)
    task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task("t")
    assert [(x.name, x.xcom_key) for x in task.operator_extra_links] == [
        ("GPU job", "_link_GpuJobLink")]


def test_registered_once_each():
    assert PROVIDER_INFO["extra-links"] == ["airflow_gpu.operators.links.GpuJobLink"]
    assert "plugins" not in PROVIDER_INFO      # the entry point alone: no double loading
    plugins = [e for e in entry_points(group="airflow.plugins")
               if e.value.startswith("airflow_gpu")]
    assert [(e.name, e.value) for e in plugins] == [("gpu", "airflow_gpu.plugin:GpuPlugin")]
    from airflow_gpu.plugin import GpuPlugin

    (app,) = GpuPlugin.fastapi_apps
    (view,) = GpuPlugin.external_views
    assert app["url_prefix"] == links.PLUGIN_APP
    assert f"/plugin/{view['url_route']}" == links.PLUGIN_PAGE
