"""A fake of the agent's DCGM interface (airflow_gpu.agent.dcgm_bindings.PyDcgm) built from
a gpu-topology/v1 model, for the tests of the bindings path.

It answers what DCGM answers on that host: DCGM GPU ids (the NVML order unless a test
permutes them), the fake NVML's UUIDs, the latest value of each field the agent watches by
DCGM field id, left out where DCGM would give a blank (row remapping before Ampere,
pending page retirement after Volta, profiling fields when a test turns them off), the
failures of DCGM's health watches, and the diagnostic's result. Values match the fake
NVML's defaults (40 C, 70 W, 512 MiB used, slowdown at 87 C). A host engine that went away
raises DcgmError from every call, as PyDcgm does.
"""

from __future__ import annotations

from airflow_gpu.agent.dcgm_bindings import DIAG_LEVELS, DcgmError, incident_text
from airflow_gpu.agent.dcgmhealth import FIELD_IDS, PROFILING
from airflow_gpu.scheduler_core.engine.topology import Topology
from tests.agent.fakenvml import fake_uuid

HEALTH_WARN, HEALTH_FAIL = 10, 20          # dcgm_structs.DCGM_HEALTH_RESULT_*
WATCH_MEM, WATCH_NVLINK, WATCH_THERMAL = 0x10, 0x2, 0x80   # DCGM_HEALTH_WATCH_*
DIAG_TESTS = {1: ["software"], 2: ["software", "pcie", "memory"],
              3: ["software", "pcie", "memory", "diagnostic", "targeted_stress",
                  "targeted_power"],
              4: ["software", "pcie", "memory", "diagnostic", "targeted_stress",
                  "targeted_power", "memtest", "pulse_test"]}


def _defaults(volta: bool) -> dict[int, float]:
    f = FIELD_IDS
    values = {
        f["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]: 0x1, f["DCGM_FI_DEV_GPU_TEMP"]: 40,
        f["DCGM_FI_DEV_POWER_USAGE"]: 70.0,
        f["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]: 1_234_567_890,
        f["DCGM_FI_DEV_SLOWDOWN_TEMP"]: 87, f["DCGM_FI_DEV_GPU_UTIL"]: 0,
        f["DCGM_FI_DEV_MEM_COPY_UTIL"]: 0, f["DCGM_FI_DEV_XID_ERRORS"]: 0,
        f["DCGM_FI_DEV_FB_USED"]: 512, f["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]: 0,
        f["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]: 0,
        f["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]: 0,
        f["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"]: 0,
        f["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"]: 0,
        f["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"]: 0,
        f["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]: 0,
        f["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]: 0.0, f["DCGM_FI_PROF_SM_ACTIVE"]: 0.0,
    }
    if volta:                     # page retirement up to Volta, row remapping from Ampere
        values[f["DCGM_FI_DEV_RETIRED_PENDING"]] = 0
    else:
        values[f["DCGM_FI_DEV_ROW_REMAP_FAILURE"]] = 0
        values[f["DCGM_FI_DEV_ROW_REMAP_PENDING"]] = 0
    return values


class FakeDcgm:
    def __init__(self, topo: Topology, ids: dict[int, int] | None = None,
                 profiling: bool = True):
        self.topo = topo
        self.id_of = ids or {g.index: g.index for g in topo.gpus}     # model index -> DCGM id
        self.gpu_ids = sorted(self.id_of.values())
        volta = any("V100" in g.name for g in topo.gpus)
        self.fields = {gpu: _defaults(volta) for gpu in self.gpu_ids}
        self.incidents: dict[int, list[tuple[int, int, str]]] = {g: [] for g in self.gpu_ids}
        self.diag_failures: dict[int, tuple[str, str]] = {}
        self.profiling = profiling
        self.up = True
        self.closed = False
        self.diags: list[tuple[int, int]] = []

    # -- test controls ------------------------------------------------------------------
    def set(self, index: int, field: str, value: float) -> None:
        """GPU `index` of the model now reports `value` for the DCGM field `field`."""
        self.fields[self.id_of[index]][FIELD_IDS[field]] = value

    def unset(self, index: int, field: str) -> None:
        """DCGM has no value for it (blank)."""
        self.fields[self.id_of[index]].pop(FIELD_IDS[field], None)

    def inject_xid(self, index: int, xid: int) -> None:
        self.set(index, "DCGM_FI_DEV_XID_ERRORS", xid)

    def add_incident(self, index: int, system: int, health: int, msg: str) -> None:
        self.incidents[self.id_of[index]].append((system, health, msg))

    def fail_diag(self, index: int, test: str, msg: str) -> None:
        self.diag_failures[self.id_of[index]] = (test, msg)

    # -- the interface ------------------------------------------------------------------
    def _answer(self) -> None:
        if self.closed:
            raise DcgmError("the DCGM handle is closed")
        if not self.up:
            raise DcgmError("Connection to the host engine is not valid any longer")

    def uuids(self) -> dict[int, str]:
        self._answer()
        return {gpu: fake_uuid(self.topo.model, index) for index, gpu in self.id_of.items()}

    def values(self, gpu_ids: list[int]) -> dict[int, dict[int, float]]:
        self._answer()
        return {g: {f: v for f, v in self.fields[g].items()
                    if self.profiling or f not in PROFILING} for g in gpu_ids}

    def health(self, gpu_ids: list[int]) -> dict[int, list[str]]:
        self._answer()
        return {g: [incident_text(system, msg) for system, health, msg in self.incidents[g]
                    if health == HEALTH_FAIL] for g in gpu_ids}

    def diag(self, gpu: int, level: int = 1) -> tuple[bool, str]:
        self._answer()
        if level not in DIAG_LEVELS:
            raise DcgmError("Bad parameter passed to function")
        self.diags.append((gpu, level))
        failed = self.diag_failures.get(gpu)
        lines = [f"{t}: {'fail' if failed and failed[0] == t else 'pass'}"
                 for t in DIAG_TESTS[level]]
        if failed and failed[0] in DIAG_TESTS[level]:
            lines.append(f"error: {failed[1]}")
            return False, "\n".join(lines)
        return True, "\n".join(lines)

    def close(self) -> None:
        self.closed = True
