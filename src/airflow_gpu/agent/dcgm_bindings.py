"""GPU health and utilization from DCGM's own Python bindings, talking to the host's DCGM
host engine (nv-hostengine, localhost:5555), and DCGM's diagnostic (`dcgmi diag`).

The bindings (pydcgm, dcgm_structs, dcgm_fields, dcgm_agent) ship with DCGM, not on PyPI:
under /usr/share/datacenter-gpu-manager-4/bindings/python3 (DCGM 4) or
/usr/local/dcgm/bindings/python3 (DCGM 3); they are imported from there. Every DCGM call
sits behind `PyDcgm`, a small interface the tests replace with a fake (tests/agent/
fakedcgm.py); `DcgmTelemetry` turns its answers into heartbeat entries with the rules the
exporter path uses (dcgmhealth.py), plus DCGM's own health watches: an incident DCGM rates
as a failure makes the GPU unhealthy while DCGM reports it (warnings do not).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from pathlib import Path

from ..scheduler_core.engine.topology import Topology
from ..scheduler_core.errors import InputError
from .dcgmhealth import FIELD_IDS, FIELD_NAMES, PROFILING, DcgmGpus, Polled
from .nvmlcalls import text

log = logging.getLogger(__name__)

BINDINGS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3",
            "/usr/local/dcgm/bindings/python3", "/usr/local/dcgm/bindings")
HOST_ENGINE = "127.0.0.1"       # nv-hostengine's default address (port 5555)
UPDATE_USEC = 1_000_000         # DCGM samples the watched fields every second
KEEP_SECONDS = 60.0
# DCGM_HEALTH_WATCH_* -> the part of the GPU an incident is about
SYSTEMS = {0x1: "PCIe", 0x2: "NVLink", 0x4: "PMU", 0x8: "MCU", 0x10: "memory", 0x20: "SM",
           0x40: "InfoROM", 0x80: "thermal", 0x100: "power", 0x200: "driver"}
DIAG_LEVELS = {1: 10, 2: 20, 3: 30, 4: 40}      # dcgmi diag -r N -> DCGM_DIAG_LVL_*
DIAG_RESULTS = {0: "pass", 1: "skip", 2: "warn", 3: "fail", 4: "not run"}


class DcgmError(Exception):
    """DCGM cannot be reached or refused a call."""


def incident_text(system: int, msg: str) -> str:
    """A failed DCGM health watch as a reason (the fake DCGM words it the same way)."""
    return f"DCGM health: {SYSTEMS.get(system, system)} failed: {msg.strip()}"


def import_bindings():
    """(pydcgm, dcgm_structs, dcgm_agent) from DCGM's install; ImportError if absent."""
    for d in BINDINGS:
        if Path(d, "pydcgm.py").is_file() and d not in sys.path:
            sys.path.append(d)
    return tuple(importlib.import_module(m) for m in ("pydcgm", "dcgm_structs", "dcgm_agent"))


def missing_bindings(why: str, what: str = "telemetry: dcgm") -> InputError:
    fix = ("" if what.startswith("--diag")
           else ", or use --dcgm-exporter URL or --telemetry nvml")
    return InputError(f"{what} needs DCGM's Python bindings (pydcgm) and its host engine "
                      f"({why}); install datacenter-gpu-manager and start nv-hostengine{fix}")


class PyDcgm:
    """The DCGM calls the agent makes, on the real bindings. Raises DcgmError where DCGM
    does not answer (connecting, or any later call)."""

    def __init__(self, address: str = HOST_ENGINE):
        try:
            self.pydcgm, self.structs, self.agent = import_bindings()
        except ImportError as exc:
            raise DcgmError(f"the bindings do not import: {exc}") from None
        s = self.structs
        try:
            self.handle = self.pydcgm.DcgmHandle(ipAddress=address,
                                                 opMode=s.DCGM_OPERATION_MODE_AUTO)
            self.system = self.handle.GetSystem()
            self.gpu_ids = list(self.system.discovery.GetAllSupportedGpuIds())
            self.group = self.pydcgm.DcgmGroup(
                self.handle, groupName=f"airflow-gpu-{os.getpid()}",
                groupType=s.DCGM_GROUP_EMPTY)
            for g in self.gpu_ids:
                self.group.AddGpu(g)
            self.fields = self._watch(list(FIELD_IDS.values()))
            self.group.health.Set(s.DCGM_HEALTH_WATCH_ALL)
            self.system.UpdateAllFields(True)
        except (s.DCGMError, OSError) as exc:
            raise DcgmError(f"no DCGM host engine answers at {address}: {exc}") from None

    def _watch(self, ids: list[int]):
        fields = self.pydcgm.DcgmFieldGroup(self.handle, name=f"airflow-gpu-{os.getpid()}",
                                            fieldIds=ids)
        try:
            self.group.samples.WatchFields(fields, UPDATE_USEC, KEEP_SECONDS, 0)
        except self.structs.DCGMError as exc:
            if not PROFILING & set(ids):
                raise
            # profiling fields are refused on some GPUs or while another profiler runs
            log.info("DCGM does not watch profiling fields here (%s); reading the rest", exc)
            fields.Delete()
            return self._watch([i for i in ids if i not in PROFILING])
        return fields

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.structs.DCGMError as exc:
            raise DcgmError(str(exc)) from None

    def uuids(self) -> dict[int, str]:
        return {g: text(self._call(self.system.discovery.GetGpuAttributes, g).identifiers.uuid)
                for g in self.gpu_ids}

    def values(self, gpu_ids: list[int]) -> dict[int, dict[int, float]]:
        """The latest value of each watched field per GPU; blank (unsupported) ones left out."""
        latest = self._call(self.group.samples.GetLatest, self.fields).values
        return {g: {f: series[-1].value for f, series in latest.get(g, {}).items()
                    if len(series) and not series[-1].isBlank}
                for g in gpu_ids}

    def health(self, gpu_ids: list[int]) -> dict[int, list[str]]:
        """The failures DCGM's health watches report now, per GPU."""
        s = self.structs
        resp = self._call(self.group.health.Check)
        out: dict[int, list[str]] = {g: [] for g in gpu_ids}
        for k in range(resp.incidentCount):
            inc = resp.incidents[k]
            gpu = inc.entityInfo.entityId
            if inc.health == s.DCGM_HEALTH_RESULT_FAIL and gpu in out:
                out[gpu].append(incident_text(inc.system, text(inc.error.msg)))
        return out

    def diag(self, gpu: int, level: int = 1) -> tuple[bool, str]:
        """DCGM's diagnostic on one GPU (level 1-4, as dcgmi diag -r): (passed, report)."""
        s = self.structs
        group = self.pydcgm.DcgmGroup(self.handle, groupName=f"airflow-gpu-diag-{gpu}",
                                      groupType=s.DCGM_GROUP_EMPTY)
        try:
            group.AddGpu(gpu)
            resp = group.action.RunDiagnostic(DIAG_LEVELS[level])
        except s.DCGMError as exc:
            return False, f"the diagnostic did not run: {exc}"
        finally:
            group.Delete()
        tests = resp.tests[:min(resp.numTests, s.DCGM_DIAG_RESPONSE_TESTS_MAX)]
        errors = resp.errors[:min(resp.numErrors, s.DCGM_DIAG_RESPONSE_ERRORS_MAX)]
        lines = [f"{text(t.name)}: {DIAG_RESULTS.get(t.result, t.result)}" for t in tests]
        lines += [f"error: {text(e.msg)}" for e in errors
                  if e.entity.entityId == gpu or e.entity.entityGroupId == 0]
        failed = any(t.result == s.DCGM_DIAG_RESULT_FAIL for t in tests)
        return not failed and bool(tests), "\n".join(lines) or "no test ran"

    def close(self) -> None:
        for what in (self.fields, self.group):
            with contextlib.suppress(self.structs.DCGMError):
                what.Delete()
        self.handle.Shutdown()


class DcgmTelemetry(Polled):
    """Health and utilization from DCGM (`api`: a PyDcgm or the tests' fake). GPUs match
    the model's by UUID when the model has them, else DCGM's GPU id is the index."""

    def __init__(self, api, topology: Topology, max_temperature: float | None = None,
                 poll: float = 5.0):
        super().__init__(poll)
        self.api = api
        self.state = DcgmGpus(topology, max_temperature)
        self.uuid_of = api.uuids()
        by_uuid = {u: g for g, u in self.uuid_of.items()}
        if all(g.uuid for g in topology.gpus):
            self.ids = {g.index: by_uuid.get(g.uuid) for g in topology.gpus}
        else:
            self.ids = {g.index: g.index if g.index in self.uuid_of else None
                        for g in topology.gpus}
        for index, gpu in self.ids.items():
            if gpu is None:
                log.warning("GPU %d: DCGM does not know it; it is reported without "
                            "utilization", index)
        self.failing = False

    def _read(self) -> list[dict]:
        ids = [g for g in self.ids.values() if g is not None]
        try:
            values, incidents = self.api.values(ids), self.api.health(ids)
        except DcgmError as exc:
            if not self.failing:
                log.warning("DCGM cannot be read (%s); GPU health stays as it was and no "
                            "utilization is reported until it answers", exc)
            self.failing = True
            return self.state.report(None)
        if self.failing:
            log.info("DCGM answers again")
            self.failing = False
        by_index = {i: g for i, g in self.ids.items() if g is not None}
        return self.state.report(
            {i: {FIELD_NAMES[f]: v for f, v in values.get(g, {}).items() if f in FIELD_NAMES}
             for i, g in by_index.items() if g in values},
            {i: self.uuid_of[g] for i, g in by_index.items() if g in self.uuid_of},
            {i: incidents.get(g, []) for i, g in by_index.items()})

    def diagnose(self, index: int, level: int = 1) -> tuple[bool, str]:
        """DCGM's diagnostic on the model's GPU `index` (run it on an idle, drained GPU)."""
        gpu = self.ids.get(index)
        if gpu is None:
            return False, f"GPU {index}: DCGM does not know it"
        return self.api.diag(gpu, level)

    def close(self) -> None:
        self.api.close()
