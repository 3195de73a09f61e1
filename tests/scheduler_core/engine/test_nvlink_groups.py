"""NVLink groups in the cluster view: what the UI draws around GPUs that share NVLink."""

from __future__ import annotations

import pytest

from airflow_gpu.scheduler_core.engine.nvlink_groups import nvlink_groups
from airflow_gpu.scheduler_core.service.core import Service, Settings
from tests.helpers import make_cluster


@pytest.mark.parametrize(("model", "groups"), [
    ("dgx-1v", [[0, 1, 2, 3], [4, 5, 6, 7]]),          # hybrid cube-mesh: two quads
    ("dgx-2", [list(range(16))]),                        # NVSwitch: one group
    ("dgx-a100", [list(range(8))]),
    ("dgx-h200", [list(range(8))]),
])
def test_groups_of_the_built_in_models(model, groups):
    host = make_cluster({"name": "h", "model": model, "rack": "r", "switch": "s"}).hosts[0]
    assert nvlink_groups(host.type.links) == groups


def test_pcie_only_gpus_are_groups_of_one():
    assert nvlink_groups([[0, 0, 0], [0, 0, 0], [0, 0, 0]]) == [[0], [1], [2]]
    assert nvlink_groups([[0, 2, 0], [2, 0, 0], [0, 0, 0]]) == [[0, 1], [2]]


def test_cluster_view_carries_fabric_and_groups(tmp_path):
    service = Service(Settings(f"sqlite:///{tmp_path}/s.db", make_cluster(
        {"name": "dgx-1", "model": "dgx-1v", "rack": "r1", "switch": "s1"})))
    (host,) = service.cluster_view()["hosts"]
    assert host["nvlink"] == {"fabric": "direct", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    service.engine.dispose()
