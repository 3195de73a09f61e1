"""GPU health and utilization from dcgm-exporter, against a stand-in serving its real format
over loopback: every mapped field reads as recorded; each health rule makes exactly its GPU
unhealthy with the same reason the NVML path gives, and the service isolates it within one
heartbeat; application XIDs change nothing; an exporter that goes away is a warning, not a
crash or an unhealthy GPU."""

from __future__ import annotations

import logging
import threading

import pytest

from airflow_gpu.agent.config import AgentConfig
from airflow_gpu.agent.dcgm_exporter import ExporterTelemetry, metrics_url
from airflow_gpu.agent.health import APPLICATION_XIDS
from airflow_gpu.agent.run import Agent
from airflow_gpu.agent.telemetry import Composed, make_source
from airflow_gpu.cli import main
from airflow_gpu.scheduler_core.engine.topology import load_topology
from airflow_gpu.scheduler_core.errors import InputError
from tests.agent.dcgmexporter import DcgmExporterStub
from tests.agent.fakenvml import fake_uuid
from tests.agent.test_agent_service import Stack, until

MiB = 2**20
NVLINK = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
          "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
          "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
          "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")


@pytest.fixture
def stub():
    with DcgmExporterStub() as s:
        yield s


@pytest.fixture
def exporter(stub):
    made = []

    def make(**kw) -> ExporterTelemetry:
        made.append(ExporterTelemetry(stub.url, load_topology("dgx-a100"), poll=0, **kw))
        return made[-1]

    yield make
    for t in made:
        t.close()


def unhealthy(gpus: list[dict]) -> dict[int, str]:
    return {g["index"]: g["reason"] for g in gpus if not g["healthy"]}


def recorded(stub: DcgmExporterStub, i: int) -> dict:
    """What the heartbeat must carry for GPU i, from the served text."""
    def v(field):
        return stub.value(i, field)
    return {"utilization_gpu": v("DCGM_FI_DEV_GPU_UTIL"),
            "utilization_memory": v("DCGM_FI_DEV_MEM_COPY_UTIL"),
            "memory_used_bytes": int(v("DCGM_FI_DEV_FB_USED")) * MiB,
            "power_watts": v("DCGM_FI_DEV_POWER_USAGE"),
            "temperature_c": v("DCGM_FI_DEV_GPU_TEMP"),
            "energy_joules": v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") / 1000,
            "ecc_corrected_total": int(v("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")),
            "nvlink_errors_total": int(sum(v(f) for f in NVLINK)),
            "thermal_throttle": bool(int(v("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")) & 0x68),
            "sm_active": pytest.approx(v("DCGM_FI_PROF_SM_ACTIVE") * 100),
            "uuid": fake_uuid("dgx-a100", i)}


def test_every_mapped_field_reads_the_recorded_value(stub, exporter):
    gpus = exporter().gpus()
    assert [g["index"] for g in gpus] == list(range(8))
    assert unhealthy(gpus) == {}
    for g in gpus:
        want = recorded(stub, g["index"])
        assert {k: g[k] for k in want} == want, g["index"]
    # the recording's own numbers, so a wrong unit cannot hide on both sides
    g0, g1, g5, g6 = gpus[0], gpus[1], gpus[5], gpus[6]
    assert (g0["utilization_gpu"], g0["utilization_memory"], g0["memory_used_bytes"],
            g0["power_watts"], g0["temperature_c"]) == (97.0, 41.0, 35210 * MiB, 312.871, 61.0)
    assert g0["energy_joules"] == 9182736.455 and g0["sm_active"] == pytest.approx(91.873)
    assert (g0["thermal_throttle"], g1["thermal_throttle"]) == (False, True)   # 0x20: SW thermal
    assert g5["ecc_corrected_total"] == 3 and g6["nvlink_errors_total"] == 15


def test_graphics_engine_activity_stands_in_for_a_missing_gpu_util(stub, exporter):
    stub.remove("DCGM_FI_DEV_GPU_UTIL")
    stub.remove("DCGM_FI_PROF_SM_ACTIVE")
    gpus = exporter().gpus()
    assert gpus[2]["utilization_gpu"] == pytest.approx(87.493)
    assert gpus[2]["sm_active"] is None and gpus[4]["utilization_gpu"] == 0.0


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("DCGM_FI_DEV_XID_ERRORS", 79, "XID 79 (GPU has fallen off the bus)"),
    ("DCGM_FI_DEV_XID_ERRORS", 48, "XID 48 (double-bit ECC error)"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2, "2 uncorrected ECC errors since the driver loaded"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, "row remapping failed; the GPU needs service"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", 1, "row remapping pending; reset the GPU"),
    ("DCGM_FI_DEV_RETIRED_PENDING", 4, "retired pages pending; reset the GPU"),
    ("DCGM_FI_DEV_GPU_TEMP", 93, "temperature 93 C is over the limit of 90 C"),
])
def test_each_health_rule_makes_exactly_its_gpu_unhealthy(stub, exporter, field, value, reason):
    t = exporter()
    assert unhealthy(t.gpus()) == {}
    stub.set(4, field, value)
    assert t.wait(0) is True               # seen by the next read: the agent reports at once
    assert unhealthy(t.gpus()) == {4: reason}
    assert t.wait(0) is False              # nothing new


def test_an_xid_stays_until_the_agent_restarts(stub, exporter):
    t = exporter()
    t.gpus()
    stub.set(3, "DCGM_FI_DEV_XID_ERRORS", 79)
    assert unhealthy(t.gpus()) == {3: "XID 79 (GPU has fallen off the bus)"}
    stub.set(3, "DCGM_FI_DEV_XID_ERRORS", 13)       # a later application error
    assert unhealthy(t.gpus()) == {3: "XID 79 (GPU has fallen off the bus)"}
    assert unhealthy(exporter().gpus()) == {}      # a new agent: DCGM's last XID predates it


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_change_nothing(stub, exporter, xid):
    t = exporter()
    t.gpus()
    stub.set(1, "DCGM_FI_DEV_XID_ERRORS", xid)
    assert t.wait(0) is False
    assert unhealthy(t.gpus()) == {}


def test_the_temperature_limit(stub, exporter):
    stub.set(7, "DCGM_FI_DEV_GPU_TEMP", 89)
    assert unhealthy(exporter().gpus()) == {}                  # 90 C when none is exported
    stub.set(7, "DCGM_FI_DEV_SLOWDOWN_TEMP", 87)               # a counters file that has it
    assert unhealthy(exporter().gpus()) == {7: "temperature 89 C is over the limit of 87 C"}
    assert unhealthy(exporter(max_temperature=95).gpus()) == {}


def test_an_exporter_that_goes_away_is_a_warning(stub, exporter, caplog):
    t = exporter()
    t.gpus()
    stub.set(2, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1)
    assert unhealthy(t.gpus()) == {2: "1 uncorrected ECC errors since the driver loaded"}
    stub.stop()
    with caplog.at_level(logging.WARNING, logger="airflow_gpu.agent.dcgm_exporter"):
        for _ in range(3):
            gpus = t.gpus()
            assert t.wait(0) is False
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "cannot be read" in warned[0] and stub.url in warned[0]
    assert unhealthy(gpus) == {2: "1 uncorrected ECC errors since the driver loaded"}
    assert all("utilization_gpu" not in g for g in gpus)       # kept health, no utilization
    stub.start()                                               # back, on the same port
    assert t.gpus()[0]["utilization_gpu"] == 97.0
    stub.status = 503                                          # answering, but an error
    assert "utilization_gpu" not in t.gpus()[0]


def test_missing_gpus_mig_series_and_unknown_gpus(stub, exporter, caplog):
    stub.drop(6)
    uuid5 = fake_uuid("dgx-a100", 5)
    mig = (f'DCGM_FI_DEV_GPU_UTIL{{gpu="5",UUID="{uuid5}",pci_bus_id="00000000:16:00.0",'
           'device="nvidia5",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="1g.5gb",'
           'GPU_I_ID="7",Hostname="dgx-a-01",DCGM_FI_DRIVER_VERSION="550.54.15"} 100')
    other = stub.lines[2].replace('gpu="0"', 'gpu="8"')
    stub.lines[2:2] = [mig, other]
    t = exporter()
    with caplog.at_level(logging.WARNING):
        gpus = t.gpus()
        t.gpus()
    assert gpus[6] == {"index": 6, "healthy": True, "reason": None}
    assert gpus[5]["utilization_gpu"] == 0.0                    # the GPU's own series
    logged = " | ".join(r.getMessage() for r in caplog.records)
    assert logged.count("GPU 6: DCGM reports no values") == 1
    assert logged.count("MIG instance series") == 1 and logged.count("GPU 8") == 1


def test_a_discovered_host_matches_gpus_by_uuid(stub, fake_host):
    host = fake_host("dgx-a100")
    text = stub.text().replace('gpu="0"', 'gpu="x"').replace('gpu="1"', 'gpu="0"')
    stub.lines = text.replace('gpu="x"', 'gpu="1"').splitlines()   # DCGM ids swapped
    src = make_source(AgentConfig(name="h1", dcgm_exporter=stub.url), host.sysfs,
                      host.procfs, nvml=host.nvml)
    try:
        assert isinstance(src, Composed) and src.topology.model == "dgx-a100"
        assert host.nvml.initialized == 0            # discovery done, NVML let go
        gpus = src.gpus()
        assert gpus[0]["uuid"] == src.topology.gpus[0].uuid == fake_uuid("dgx-a100", 0)
        assert (gpus[0]["utilization_gpu"], gpus[1]["thermal_throttle"]) == (97.0, True)
    finally:
        src.close()


def test_settings_errors_name_the_fix():
    with pytest.raises(InputError, match="dcgm_exporter: 'ftp://x' is not an http"):
        metrics_url("ftp://x")
    assert metrics_url("localhost:9400") == "http://localhost:9400/metrics"
    with pytest.raises(InputError, match="read with telemetry dcgm or auto, not nvml"):
        make_source(AgentConfig(telemetry="nvml", dcgm_exporter="http://x:9400"))
    with pytest.raises(InputError, match="telemetry: nvml needs NVML discovery"):
        make_source(AgentConfig(telemetry="nvml", declared="dgx-a100"))


def test_a_declared_host_fed_by_the_exporter_through_the_service(db_url, tmp_path, stub,
                                                                  capsys):
    """Faults of several rules at once, each on its GPU, reach the service with the next
    heartbeat; an application XID on another GPU changes nothing. The CLI takes the same
    options."""
    s = Stack(db_url, tmp_path)
    config = AgentConfig(server=s.server.url, token=s.admin_token, name="dgx-a-01",
                         rack="r1", switch="s1", declared="dgx-a100", dcgm_exporter=stub.url)
    src = make_source(config)
    try:
        agent = Agent(config, src, s.admin)
        agent.register()
        agent.report()
        gpus = s.host("dgx-a-01")["gpus"]
        assert all(g["healthy"] for g in gpus)
        for g in gpus:                       # the cluster view carries the recorded values
            want = recorded(stub, g["index"])
            shown = [k for k in want if k in g]
            assert {"utilization_gpu", "memory_used_bytes", "power_watts"} <= set(shown)
            assert {k: g[k] for k in shown} == {k: want[k] for k in shown}, g["index"]
        stub.set(3, "DCGM_FI_DEV_XID_ERRORS", 79)
        stub.set(5, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1)
        stub.set(6, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)
        stub.set(1, "DCGM_FI_DEV_XID_ERRORS", 13)
        agent.report()                       # one heartbeat
        bad = {g["index"]: g["health_reason"] for g in s.host("dgx-a-01")["gpus"]
               if not g["healthy"]}
        assert bad == {3: "XID 79 (GPU has fallen off the bus)",
                       5: "1 uncorrected ECC errors since the driver loaded",
                       6: "row remapping failed; the GPU needs service"}

        assert main(["agent", "--server", s.server.url, "--token", s.admin_token,
                     "--declared", "dgx-a100", "--dcgm-exporter", stub.url, "--name",
                     "sim-01", "--once"]) == 0
        sim = s.host("sim-01")["gpus"]
        assert [g["utilization_gpu"] for g in sim] == [97.0, 95.0, 88.0] + [0.0] * 5
        assert main(["agent", "--server", s.server.url, "--token", s.admin_token,
                     "--declared", "dgx-a100", "--telemetry", "nvml", "--name", "n2",
                     "--once"]) == 2
        assert "telemetry: nvml needs NVML discovery" in capsys.readouterr().err
    finally:
        src.close()
        s.close()


def test_the_agent_loop_polls_the_exporter_between_heartbeats(db_url, tmp_path, stub):
    s = Stack(db_url, tmp_path)
    config = AgentConfig(server=s.server.url, token=s.admin_token, name="dgx-a-01",
                         rack="r1", switch="s1", declared="dgx-a100", dcgm_exporter=stub.url,
                         interval=3600)
    src = make_source(config)
    src.telemetry.poll = 0.2
    stop = threading.Event()
    loop = threading.Thread(target=Agent(config, src, s.admin).run, args=(stop,), daemon=True)
    loop.start()
    try:
        until(lambda: any(h["name"] == "dgx-a-01" for h in s.admin.cluster()["hosts"]),
              "the agent registered")
        until(lambda: s.host("dgx-a-01")["gpus"][0]["utilization_gpu"] == 97.0, "reported")
        stub.set(2, "DCGM_FI_DEV_XID_ERRORS", 74)
        until(lambda: not s.host("dgx-a-01")["gpus"][2]["healthy"], "GPU 2 unhealthy")
        assert s.host("dgx-a-01")["gpus"][2]["health_reason"] == "XID 74 (NVLink error)"
    finally:
        stop.set()
        loop.join(timeout=10)
        src.close()
        s.close()
    assert not loop.is_alive()
