"""What both DCGM paths share (the dcgm-exporter endpoint and DCGM's own Python bindings):
the DCGM fields the agent reads, how they become a heartbeat's per-GPU values, and the
health rules of health.py applied to them.

The values of one read are keyed by DCGM field name (`DCGM_FI_DEV_GPU_UTIL`), as the
exporter names its metrics; the bindings path turns field ids into these names with
FIELD_IDS. The ids are DCGM's and have not changed between releases; DCGM 4.6 renamed some
fields (DCGM_FI_DEV_GPU_UTIL is DCGM_FI_DEV_GPU_UTIL_RATIO there) and keeps the old names
as aliases, which is what dcgm-exporter 4.5.3-4.8.2 still prints.
"""

from __future__ import annotations

import logging
import time

from ..scheduler_core.engine.topology import Topology
from .health import (
    APPLICATION_XIDS,
    DEFAULT_MAX_TEMPERATURE,
    counter_reasons,
    thermal_throttle,
    xid_fault,
    xid_reason,
)

log = logging.getLogger(__name__)

MiB = 2**20
FIELD_IDS = {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 112,      # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS before
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,               # W
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,  # mJ since the driver loaded
    "DCGM_FI_DEV_SLOWDOWN_TEMP": 158,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 204,
    "DCGM_FI_DEV_XID_ERRORS": 230,                # the last XID seen, not a count
    "DCGM_FI_DEV_FB_USED": 252,                   # MiB
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 310,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 311,
    "DCGM_FI_DEV_RETIRED_PENDING": 392,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 396,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 409,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 419,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 429,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 439,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,        # ratio 0-1
    "DCGM_FI_PROF_SM_ACTIVE": 1002,               # ratio 0-1
}
FIELD_NAMES = {v: k for k, v in FIELD_IDS.items()}
PROFILING = frozenset(v for k, v in FIELD_IDS.items() if k.startswith("DCGM_FI_PROF_"))
NVLINK_ERRORS = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")
THROTTLE = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")


def utilization(v: dict[str, float]) -> dict:
    """A heartbeat's values from one GPU's DCGM fields (absent field: None)."""
    util = v.get("DCGM_FI_DEV_GPU_UTIL")
    if util is None and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in v:
        util = v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] * 100
    errors = [v[k] for k in NVLINK_ERRORS if k in v]
    reasons = next((v[k] for k in THROTTLE if k in v), None)
    sm = v.get("DCGM_FI_PROF_SM_ACTIVE")

    def num(key: str, scale: float = 1.0) -> float | None:
        return v[key] * scale if key in v else None

    used = num("DCGM_FI_DEV_FB_USED", MiB)
    energy = v.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")     # mJ
    sbe = v.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    return {
        "utilization_gpu": _pct(util),
        "utilization_memory": _pct(v.get("DCGM_FI_DEV_MEM_COPY_UTIL")),
        "memory_used_bytes": int(used) if used is not None else None,
        "power_watts": num("DCGM_FI_DEV_POWER_USAGE"),
        "temperature_c": num("DCGM_FI_DEV_GPU_TEMP"),
        "energy_joules": energy / 1000 if energy is not None else None,
        "ecc_corrected_total": int(sbe) if sbe is not None else None,
        "nvlink_errors_total": int(sum(errors)) if errors else None,
        "thermal_throttle": thermal_throttle(int(reasons) if reasons is not None else None),
        "sm_active": _pct(sm * 100 if sm is not None else None),
    }


def _pct(x: float | None) -> float | None:
    return None if x is None else min(100.0, max(0.0, float(x)))


class DcgmGpus:
    """The per-GPU state DCGM reads build on: XIDs already seen, sticky XID faults and the
    last health of each GPU (kept while the source cannot be read)."""

    def __init__(self, topology: Topology, max_temperature: float | None = None):
        self.indexes = [g.index for g in topology.gpus]
        self.max_temperature = max_temperature
        self.faults: dict[int, str] = {}
        self.last_xid: dict[int, int] = {}
        self.last: dict[int, tuple[bool, str | None]] = {i: (True, None) for i in self.indexes}
        self._missing: set[int] = set()

    def report(self, values: dict[int, dict[str, float]] | None,
               uuids: dict[int, str] | None = None,
               incidents: dict[int, list[str]] | None = None) -> list[dict]:
        """Each GPU's heartbeat entry. `values` None: the source is away, so health stays
        as it was and there is no utilization; a GPU absent from `values` likewise."""
        uuids, incidents = uuids or {}, incidents or {}
        out = []
        for i in self.indexes:
            entry = {"index": i}
            if uuids.get(i):
                entry["uuid"] = uuids[i]
            v = None if values is None else values.get(i)
            if v is None:
                if values is not None and i not in self._missing:
                    self._missing.add(i)
                    log.warning("GPU %d: DCGM reports no values for it; its health stays as "
                                "it was, without utilization", i)
                healthy, reason = self.last[i]
                out.append({**entry, "healthy": healthy, "reason": reason})
                continue
            self._missing.discard(i)
            reasons = self._reasons(i, v) + list(incidents.get(i, []))
            self.last[i] = (not reasons, "; ".join(reasons) or None)
            out.append({**entry, "healthy": not reasons, "reason": self.last[i][1],
                        **utilization(v)})
        return out

    def _reasons(self, i: int, v: dict[str, float]) -> list[str]:
        self._xid(i, v.get("DCGM_FI_DEV_XID_ERRORS"))
        limit = self.max_temperature
        if limit is None:
            limit = v.get("DCGM_FI_DEV_SLOWDOWN_TEMP") or DEFAULT_MAX_TEMPERATURE
        sticky = [self.faults[i]] if i in self.faults else []
        return sticky + counter_reasons(
            int(v.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") or 0),
            bool(v.get("DCGM_FI_DEV_ROW_REMAP_PENDING")),
            bool(v.get("DCGM_FI_DEV_ROW_REMAP_FAILURE")),
            bool(v.get("DCGM_FI_DEV_RETIRED_PENDING")),
            v.get("DCGM_FI_DEV_GPU_TEMP"), limit)

    def _xid(self, i: int, value: float | None) -> None:
        """DCGM keeps the last XID, not each event: a new value is a new XID. The value
        seen first predates the agent (as XIDs before an NVML agent starts, it does not
        count); the same XID twice in a row is one event here."""
        if value is None:
            return
        xid = int(value)
        before = self.last_xid.get(i)
        self.last_xid[i] = xid
        if before is None:
            if xid and xid not in APPLICATION_XIDS:
                log.warning("GPU %d: DCGM's last XID is %s, from before the agent started; "
                            "not counted", i, xid_reason(xid))
            return
        if xid == before or not xid or i in self.faults:
            return
        reason = xid_fault(i, xid)
        if reason is not None:
            log.warning("GPU %d unhealthy: %s", i, reason)
            self.faults[i] = reason


class Polled:
    """A telemetry read on demand: `gpus()` reads now; `wait()` reads again every `poll`
    seconds and returns True as soon as a GPU turned unhealthy (DCGM has no event the agent
    could block on); the heartbeat that follows sends that read."""

    FRESH = 1.0          # seconds a read that saw a fault may stand in for a new one

    def __init__(self, poll: float = 5.0):
        self.poll = poll
        self._next = 0.0                 # the first wait() reads
        self._fault_read: tuple[float, list[dict]] | None = None
        self._unhealthy: set[int] = set()

    def _read(self) -> list[dict]:
        raise NotImplementedError

    def _take(self) -> tuple[list[dict], bool]:
        """Read now; also whether a GPU is unhealthy that was not at the last read."""
        got = self._read()
        bad = {g["index"] for g in got if not g["healthy"]}
        new, self._unhealthy = bad - self._unhealthy, bad
        return got, bool(new)

    def gpus(self) -> list[dict]:
        held, self._fault_read = self._fault_read, None
        if held is not None and time.monotonic() - held[0] < self.FRESH:
            return held[1]
        return self._take()[0]

    def wait(self, seconds: float) -> bool:
        end = time.monotonic() + max(0.0, seconds)
        while True:
            now = time.monotonic()
            if now >= self._next:
                self._next = now + self.poll
                got, turned = self._take()
                if turned:
                    self._fault_read = (time.monotonic(), got)
                    return True
            if now >= end:
                return False
            time.sleep(max(0.0, min(end, self._next) - now))
