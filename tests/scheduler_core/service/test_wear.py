"""Worn GPUs through the real service (SQLite and PostgreSQL): a GPU whose correctable
ECC or NVLink error counter rises, or that throttles for heat, stays schedulable but a
long job is placed away from it; a counter that only stays where it was changes
nothing."""

from __future__ import annotations

import pytest

from tests.scheduler_core.api.test_api import auth, spec, submit
from tests.scheduler_core.service.test_accounting import report
from tests.scheduler_core.service.test_reclaim_and_requeue import job


def placed(api, name: str, gpus: int, runtime: str) -> dict:
    j = submit(api, "vision", spec(name, gpus, runtime=runtime)).json()
    api.tick()
    return job(api, j["id"])


@pytest.mark.parametrize("signal", ["ecc", "nvlink", "thermal"])
def test_a_long_job_avoids_a_worn_host_and_a_short_one_may_use_it(api, signal):
    key, before, after = {"ecc": ("ecc_corrected_total", 3, 9),
                          "nvlink": ("nvlink_errors_total", 0, 40),
                          "thermal": ("thermal_throttle", False, True)}[signal]
    report(api, "dgx-1", {g: {key: before} for g in range(8)})
    report(api, "dgx-1", {g: {key: after if g == 2 else before} for g in range(8)})
    cluster = api.get("/api/v1/cluster", headers=auth(api, "vision")).json()
    assert all(g["healthy"] for h in cluster["hosts"] for g in h["gpus"])
    worn = {(h["name"], g["index"]): g["worn"] for h in cluster["hosts"] for g in h["gpus"]
            if g["worn"]}
    assert list(worn) == [("dgx-1", 2)]
    assert {"ecc": "correctable ECC", "nvlink": "NVLink errors",
            "thermal": "thermal throttling"}[signal] in worn["dgx-1", 2]
    # without wear an 8-GPU job takes dgx-1 (the lowest index of equals)
    long = placed(api, "long", 8, "12h")
    assert long["state"] == "admitted" and long["replicas"][0]["host"] == "dgx-2"
    short = placed(api, "short", 8, "20m")       # not steered: it still starts
    assert short["state"] == "admitted" and short["replicas"][0]["host"] == "dgx-1"


def test_a_counter_that_does_not_rise_wears_nothing(api):
    for _ in range(2):
        report(api, "dgx-1", {g: {"ecc_corrected_total": 5, "nvlink_errors_total": 7}
                              for g in range(8)})
    assert placed(api, "long", 8, "12h")["replicas"][0]["host"] == "dgx-1"


def test_inside_a_host_a_replica_takes_worn_gpus_last(api):
    report(api, "dgx-1", {g: {"nvlink_errors_total": 0} for g in range(8)})
    report(api, "dgx-1", {g: {"nvlink_errors_total": 5 if g < 4 else 0} for g in range(8)})
    report(api, "dgx-2", {g: {"thermal_throttle": True} for g in range(8)})
    j = placed(api, "long", 4, "12h")
    assert (j["replicas"][0]["host"], j["replicas"][0]["gpus"]) == ("dgx-1", [4, 5, 6, 7])
