"""GPU health and utilization through DCGM's Python bindings, on a fake of the agent's DCGM
interface (tests/agent/fakedcgm.py): fields, the health rules NVML and the exporter share,
DCGM's own health watches, a host engine that goes away, the diagnostic, and which source
`--telemetry` picks."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from airflow_gpu.agent.cli import cmd_agent
from airflow_gpu.agent.config import AgentConfig
from airflow_gpu.agent.dcgm_bindings import DcgmError, DcgmTelemetry
from airflow_gpu.agent.declared import DeclaredSource
from airflow_gpu.agent.source import NvmlSource
from airflow_gpu.agent.telemetry import Composed, discover_host, make_source
from airflow_gpu.cli import build_parser
from airflow_gpu.scheduler_core.engine.topology import load_topology
from airflow_gpu.scheduler_core.errors import InputError
from tests.agent.fakedcgm import HEALTH_FAIL, HEALTH_WARN, WATCH_MEM, WATCH_NVLINK, FakeDcgm
from tests.agent.fakenvml import fake_uuid

MiB = 2**20


def unhealthy(gpus: list[dict]) -> dict[int, str]:
    return {g["index"]: g["reason"] for g in gpus if not g["healthy"]}


@pytest.fixture
def dcgm():
    """dcgm("dgx-h100") -> (fake DCGM, telemetry on the model as a declared host has it)."""
    made = []

    def make(model: str = "dgx-a100", **kw):
        topo = load_topology(model)
        fake = FakeDcgm(topo, **kw)
        made.append(DcgmTelemetry(fake, topo, poll=0))
        return fake, made[-1]

    yield make
    for t in made:
        t.close()


def test_fields_become_the_heartbeat(dcgm):
    fake, t = dcgm("dgx-h100")
    fake.set(2, "DCGM_FI_DEV_GPU_UTIL", 93)
    fake.set(2, "DCGM_FI_DEV_MEM_COPY_UTIL", 41)
    fake.set(2, "DCGM_FI_DEV_FB_USED", 8192)
    fake.set(2, "DCGM_FI_DEV_POWER_USAGE", 312.5)
    fake.set(2, "DCGM_FI_DEV_GPU_TEMP", 66)
    fake.set(2, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 5_000_250)
    fake.set(2, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 7)
    fake.set(2, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 3)
    fake.set(2, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 2)
    fake.set(2, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0x40)          # HW thermal slowdown
    fake.set(2, "DCGM_FI_PROF_SM_ACTIVE", 0.875)
    g = t.gpus()[2]
    assert g == {"index": 2, "healthy": True, "reason": None, "uuid": fake_uuid("dgx-h100", 2),
                 "utilization_gpu": 93.0, "utilization_memory": 41.0,
                 "memory_used_bytes": 8192 * MiB, "power_watts": 312.5, "temperature_c": 66.0,
                 "energy_joules": 5000.25, "ecc_corrected_total": 7, "nvlink_errors_total": 5,
                 "thermal_throttle": True, "sm_active": 87.5}
    assert t.gpus()[0]["thermal_throttle"] is False                 # 0x1: idle


def test_without_profiling_fields_and_without_gpu_util(dcgm):
    fake, t = dcgm(profiling=False)
    assert t.gpus()[0]["sm_active"] is None
    fake2, t2 = dcgm()
    fake2.unset(1, "DCGM_FI_DEV_GPU_UTIL")
    fake2.set(1, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5)
    assert t2.gpus()[1]["utilization_gpu"] == 50.0


@pytest.mark.parametrize(("model", "field", "value", "reason"), [
    ("dgx-a100", "DCGM_FI_DEV_XID_ERRORS", 79, "XID 79 (GPU has fallen off the bus)"),
    ("dgx-a100", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1,
     "1 uncorrected ECC errors since the driver loaded"),
    ("dgx-a100", "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, "row remapping failed; the GPU needs service"),
    ("dgx-h200", "DCGM_FI_DEV_ROW_REMAP_PENDING", 1, "row remapping pending; reset the GPU"),
    ("dgx-1v", "DCGM_FI_DEV_RETIRED_PENDING", 2, "retired pages pending; reset the GPU"),
    ("dgx-2", "DCGM_FI_DEV_GPU_TEMP", 91, "temperature 91 C is over the limit of 87 C"),
])
def test_the_health_rules(dcgm, model, field, value, reason):
    fake, t = dcgm(model)
    assert unhealthy(t.gpus()) == {}
    fake.set(5, field, value)
    assert t.wait(0) is True
    assert unhealthy(t.gpus()) == {5: reason}


def test_xids_are_sticky_and_application_xids_change_nothing(dcgm):
    fake, t = dcgm()
    t.gpus()
    fake.inject_xid(1, 13)
    fake.inject_xid(2, 43)
    assert t.wait(0) is False and unhealthy(t.gpus()) == {}
    fake.inject_xid(1, 48)
    assert unhealthy(t.gpus()) == {1: "XID 48 (double-bit ECC error)"}
    fake.inject_xid(1, 13)
    assert unhealthy(t.gpus()) == {1: "XID 48 (double-bit ECC error)"}


def test_dcgm_health_watch_failures_count_and_warnings_do_not(dcgm):
    fake, t = dcgm()
    fake.add_incident(3, WATCH_NVLINK, HEALTH_WARN, "NvLink CRC errors rising on GPU 3")
    assert unhealthy(t.gpus()) == {}
    fake.add_incident(6, WATCH_MEM, HEALTH_FAIL, "A DBE error occurred on GPU 6 ")
    assert unhealthy(t.gpus()) == {6: "DCGM health: memory failed: A DBE error occurred on "
                                      "GPU 6"}


def test_a_host_engine_that_goes_away_is_a_warning(dcgm, caplog):
    fake, t = dcgm()
    fake.set(4, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)
    fake.set(0, "DCGM_FI_DEV_GPU_UTIL", 55)
    t.gpus()
    fake.up = False
    with caplog.at_level(logging.WARNING, logger="airflow_gpu.agent.dcgm_bindings"):
        gpus = t.gpus()
        assert t.wait(0) is False
    assert len(caplog.records) == 1 and "DCGM cannot be read" in caplog.records[0].getMessage()
    assert unhealthy(gpus) == {4: "row remapping failed; the GPU needs service"}
    assert "utilization_gpu" not in gpus[0]
    fake.up = True
    assert t.gpus()[0]["utilization_gpu"] == 55.0


def test_a_discovered_host_maps_dcgm_ids_by_uuid(fake_host):
    host = fake_host("dgx-h100")
    topo = discover_host(host.nvml, host.sysfs, host.procfs, "h1")
    fake = FakeDcgm(topo, ids={i: 7 - i for i in range(8)})     # DCGM numbers them backwards
    fake.set(1, "DCGM_FI_DEV_GPU_UTIL", 11)
    t = DcgmTelemetry(fake, topo, poll=0)
    gpus = t.gpus()
    assert gpus[1]["utilization_gpu"] == 11.0 and gpus[6]["utilization_gpu"] == 0.0
    assert [g["uuid"] for g in gpus] == [g.uuid for g in topo.gpus]
    fake.fail_diag(1, "memory", "Memory test failed on GPU 1")
    assert t.diagnose(1, 2) == (False, "software: pass\npcie: pass\nmemory: fail\n"
                                       "error: Memory test failed on GPU 1")
    assert fake.diags == [(6, 2)]                              # DCGM's id of GPU 1
    assert t.diagnose(2)[0] is True


def test_telemetry_selection(fake_host):
    host = fake_host("dgx-a100")

    def source(dcgm=None, **kw):
        return make_source(AgentConfig(name="h1", **kw), host.sysfs, host.procfs, host.nvml,
                           dcgm)

    def no_dcgm():
        raise DcgmError("the bindings do not import: No module named 'pydcgm'")

    fake = FakeDcgm(host.topo)
    auto = source(lambda: fake)                       # auto, DCGM there
    assert isinstance(auto, Composed) and auto.what == "DCGM's host engine"
    assert host.nvml.initialized == 0 and auto.topology.gpus[0].uuid
    auto.close()
    assert fake.closed
    plain = source(no_dcgm)                           # auto, no DCGM: NVML
    assert isinstance(plain, NvmlSource)
    plain.close()
    with pytest.raises(InputError) as err:
        source(no_dcgm, telemetry="dcgm")
    assert str(err.value) == (
        "telemetry: dcgm needs DCGM's Python bindings (pydcgm) and its host engine (the "
        "bindings do not import: No module named 'pydcgm'); install datacenter-gpu-manager "
        "and start nv-hostengine, or use --dcgm-exporter URL or --telemetry nvml")
    assert isinstance(source(no_dcgm, declared="dgx-a100"), DeclaredSource)
    declared = source(lambda: FakeDcgm(host.topo), declared="dgx-a100", telemetry="dcgm")
    assert isinstance(declared, Composed) and declared.gpus()[0]["temperature_c"] == 40.0
    declared.close()


def test_without_the_bindings_the_error_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydcgm", None)         # as on a host without DCGM
    with pytest.raises(InputError) as err:
        make_source(AgentConfig(name="h1", declared="dgx-a100", telemetry="dcgm"))
    assert str(err.value).startswith("telemetry: dcgm needs DCGM's Python bindings (pydcgm) "
                                     "and its host engine (the bindings do not import: ")
    assert str(err.value).endswith("or use --dcgm-exporter URL or --telemetry nvml")
    auto = make_source(AgentConfig(name="h1", declared="dgx-a100"))
    assert isinstance(auto, DeclaredSource)              # auto: nothing, as before


def test_the_diag_command(fake_host, capsys):
    host = fake_host("dgx-a100")
    fake = FakeDcgm(host.topo)
    fake.fail_diag(3, "software", "Persistence mode for GPU 3 is disabled")
    parser = build_parser()

    def connect():                     # each command connects anew
        fake.closed = False
        return fake

    def run(*argv):
        args = parser.parse_args(["agent", *argv, "--sysfs", str(host.sysfs),
                                  "--procfs", str(host.procfs)])
        return cmd_agent(args, host.nvml, connect)

    assert run("--diag", "2") == 0
    assert capsys.readouterr().out == ("software: pass\n"
                                       "GPU 2: DCGM diagnostic level 1 passed\n")
    assert run("--diag", "3") == 1
    out = capsys.readouterr().out
    assert "error: Persistence mode for GPU 3 is disabled" in out and "FAILED" in out
    with pytest.raises(InputError, match="--diag: this host has no GPU 9"):
        run("--diag", "9")
    with pytest.raises(InputError, match="--diag-level: 7 is not a level"):
        run("--diag", "1", "--diag-level", "7")
    fake.up = False
    with pytest.raises(InputError, match="--diag: DCGM did not answer"):
        run("--diag", "1")
    assert fake.closed


@pytest.mark.gpu
def test_the_bindings_path_on_this_host():
    """DCGM for real: its bindings, the local host engine and NVML discovery. Skipped,
    with the reason, where one of them is missing."""
    from airflow_gpu.agent.dcgm_bindings import PyDcgm

    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    try:
        api = PyDcgm()
    except DcgmError as exc:
        pytest.skip(f"DCGM is not usable here: {exc}")
    try:
        topo = discover_host(pynvml, Path("/sys"), Path("/proc"), None)
    except InputError as exc:
        api.close()
        pytest.skip(str(exc))
    t = DcgmTelemetry(api, topo, poll=0)
    try:
        gpus = t.gpus()
        assert [g["index"] for g in gpus] == [g.index for g in topo.gpus]
        for g, model in zip(gpus, topo.gpus, strict=True):
            assert g["uuid"] == model.uuid
            assert isinstance(g["healthy"], bool) and (g["healthy"] or g["reason"])
            assert g.get("temperature_c") is None or 0 < g["temperature_c"] < 120
            assert g.get("memory_used_bytes") is None or g["memory_used_bytes"] >= 0
        assert t.wait(0.1) in (True, False)
        print(gpus)
    finally:
        t.close()
