"""Health rules and utilization on a fake NVML: hardware XIDs, double-bit ECC errors, row
remapping, pending page retirement, temperature and a lost GPU make a GPU unhealthy;
application XIDs do not. The wear signals (energy, corrected ECC and NVLink errors, thermal
throttling) and the GPU's UUID come with each sample."""

from __future__ import annotations

import re

import pytest

from airflow_gpu.agent.health import APPLICATION_XIDS, HealthMonitor
from airflow_gpu.agent.source import NvmlSource
from tests.agent.fakenvml import fake_uuid


@pytest.fixture
def source(fake_host):
    made = []

    def make(model: str = "dgx-a100", **kw) -> NvmlSource:
        host = fake_host(model)
        src = NvmlSource(host.nvml, host.sysfs, host.procfs, "h1", **kw)
        src.fake = host.nvml
        made.append(src)
        return src

    yield make
    for src in made:
        src.close()


def states(src) -> dict[int, str | None]:
    """Unhealthy GPUs and why."""
    return {g["index"]: g["reason"] for g in src.gpus() if not g["healthy"]}


def test_a_hardware_xid_makes_its_gpu_unhealthy_until_restart(source):
    src = source()
    assert states(src) == {}
    src.fake.inject_xid(3, 79)
    assert src.wait(0) is True            # seen at once: the agent reports right away
    assert states(src) == {3: "XID 79 (GPU has fallen off the bus)"}
    assert src.wait(0) is False           # nothing new
    assert states(src) == {3: "XID 79 (GPU has fallen off the bus)"}   # sticky


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_change_nothing(source, xid):
    src = source()
    src.fake.inject_xid(1, xid)
    assert src.wait(0) is False
    assert states(src) == {}


def test_a_double_bit_ecc_error(source):
    src = source()
    src.fake.inject_double_bit_ecc(5)
    assert src.wait(0) is True
    assert states(src) == {5: "double-bit ECC error; 1 uncorrected ECC errors since the "
                              "driver loaded"}


def test_uncorrected_ecc_counted_without_an_event(source):
    src = source()
    src.fake.state[2].ecc_volatile = 4        # e.g. the agent started after the error
    assert states(src) == {2: "4 uncorrected ECC errors since the driver loaded"}


def test_row_remapping_on_ampere_and_page_retirement_on_volta(source):
    a100 = source("dgx-a100")
    a100.fake.state[0].remap_pending = True
    a100.fake.state[1].remap_failed = True
    assert states(a100) == {0: "row remapping pending; reset the GPU",
                            1: "row remapping failed; the GPU needs service"}
    v100 = source("dgx-1v")
    v100.fake.state[6].retired_pending = True
    assert states(v100) == {6: "retired pages pending; reset the GPU"}


def test_temperature_over_the_limit(source):
    src = source()                         # the GPU's slowdown temperature: 87 C here
    src.fake.state[7].temperature = 91
    assert states(src) == {7: "temperature 91 C is over the limit of 87 C"}
    hot_ok = source(max_temperature=95)
    hot_ok.fake.state[7].temperature = 91
    assert states(hot_ok) == {}


def test_a_lost_gpu(source):
    src = source()
    src.fake.state[4].lost = True
    reason = states(src)[4]
    assert reason.startswith("GPU is lost")
    assert next(g for g in src.gpus() if g["index"] == 4).get("utilization_gpu") is None


def test_utilization_is_sampled(source):
    src = source()
    s = src.fake.state[2]
    s.util_gpu, s.util_memory, s.memory_used = 93, 41, 2**33
    s.power_mw, s.temperature = 312_500, 66
    g = src.gpus()[2]
    assert (g["utilization_gpu"], g["utilization_memory"], g["memory_used_bytes"],
            g["power_watts"], g["temperature_c"]) == (93.0, 41.0, 2**33, 312.5, 66.0)


def test_wear_signals_and_the_uuid_are_sampled(source):
    import pynvml

    src = source()
    fake = src.fake
    s = fake.state[3]
    s.energy_mj, s.ecc_corrected = 7_654_321, 12
    s.clock_reasons = pynvml.nvmlClocksEventReasonSwThermalSlowdown
    fake.add_nvlink_errors(3, 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY, 4)
    fake.add_nvlink_errors(3, 5, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
    fake.add_nvlink_errors(3, 5, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
    fake.add_nvlink_errors(3, 11, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, 2)
    g = src.gpus()[3]
    assert g["uuid"] == fake.nvmlDeviceGetUUID(src.handles[3]) == src.topology.gpus[3].uuid
    assert (g["energy_joules"], g["ecc_corrected_total"], g["nvlink_errors_total"],
            g["thermal_throttle"]) == (7654.321, 12, 8, True)
    assert g["healthy"]                     # wear is for the service to weigh, not a fault
    other = src.gpus()[4]
    assert (other["ecc_corrected_total"], other["nvlink_errors_total"],
            other["thermal_throttle"]) == (0, 0, False)          # 0x1: idle, not heat
    s.links_down = {11}                     # a link that is down is not counted
    s.clock_reasons = pynvml.nvmlClocksEventReasonHwSlowdown
    assert (src.gpus()[3]["nvlink_errors_total"], src.gpus()[3]["thermal_throttle"]) == (6, True)


def test_wear_signals_on_older_drivers(fake_host):
    host = fake_host("dgx-a100", missing=("nvmlDeviceGetCurrentClocksEventReasons",))
    src = NvmlSource(host.nvml, host.sysfs, host.procfs, "h1")
    try:
        host.nvml.state[0].clock_reasons = 0x40          # HW thermal, via the throttle name
        assert src.gpus()[0]["thermal_throttle"] is True
    finally:
        src.close()
    host = fake_host("dgx-a100", missing=(
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetNvLinkErrorCounter"))
    src = NvmlSource(host.nvml, host.sysfs, host.procfs, "h1")
    try:
        g = src.gpus()[0]
        assert (g["thermal_throttle"], g["energy_joules"], g["nvlink_errors_total"]) == (
            None, None, None)
    finally:
        src.close()


def test_events_on_unregistered_gpus_or_without_an_event_set(fake_host):
    host = fake_host("dgx-h100", missing=("nvmlEventSetCreate",))
    host.nvml.nvmlInit()
    handles = [host.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    monitor = HealthMonitor(host.nvml, handles)
    assert monitor.events is None          # counters still work
    host.nvml.inject_double_bit_ecc(0)
    assert monitor.wait(0) is False
    assert [g.index for g in monitor.check() if not g.healthy] == [0]


def test_the_fake_keeps_nvml_semantics(fake_host):
    import pynvml

    host = fake_host("dgx-2")
    nvml = host.nvml
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert nvml.nvmlDeviceGetPciInfo(h).busId.startswith("00000000:")
    assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0) == (
        pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(h, 6)          # a V100 has 6 links
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNumaNodeId(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(h)                # Volta has no MIG
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, 7)     # no such counter
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 0
    uuid = nvml.nvmlDeviceGetUUID(h)                 # NVML's form, the same in every run
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", uuid)
    assert uuid == fake_uuid("dgx-2", 0)
    words = nvml.nvmlDeviceGetCpuAffinity(h, 2)
    # cpus 0-23,48-71 as two 64-bit words
    assert list(words) == [(1 << 24) - 1 | ((1 << 16) - 1) << 48, (1 << 8) - 1]
    es = nvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(es, 0)
    nvml.nvmlShutdown()
