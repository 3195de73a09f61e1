"""GPU health and utilization from NVIDIA's dcgm-exporter: the agent reads the exporter's
Prometheus endpoint (`--dcgm-exporter URL`, e.g. http://localhost:9400/metrics) and applies
the health rules of health.py to DCGM's fields.

Metric names, labels and value formats are those of dcgm-exporter 4.5.3-4.8.2 (DCGM
4.5.3; etc/default-counters.csv and its render template): one series per GPU and field,
labelled gpu (DCGM's GPU id), UUID (`uuid` with --use-old-namespace), pci_bus_id, device,
modelName, Hostname (`hostname` from the release after 4.5.3-4.8.2), the fields the
counters file declares as labels (DCGM_FI_DRIVER_VERSION) and attributes: err_code and
err_msg on DCGM_FI_DEV_XID_ERRORS, hpc_job (one series per job on the GPU) with HPC job
mapping, pod/namespace/container on Kubernetes. MIG instances (series with GPU_I_ID) are
not read yet: their GPU's own series carry what the agent needs. Series of NVLink links and
NVSwitches (an `nvlink` or `nvswitch` label) are not GPU series.

The exporter's default counters lack the ECC, retired-page and NVLink error fields; the
health rules need them in its counters file (docs/agent.md lists the lines).

An exporter that cannot be read marks no GPU unhealthy: the agent logs a warning, keeps
each GPU's health as it last was and reports no utilization until it answers again, for as
long as it takes (a GPU fault that happens meanwhile is seen once it answers: the XID it
shows is the last one, ECC and row-remap counters persist).
"""

from __future__ import annotations

import logging
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..scheduler_core.engine.topology import Topology
from ..scheduler_core.errors import InputError
from .dcgmhealth import DcgmGpus, Polled

log = logging.getLogger(__name__)

TIMEOUT = 3.0       # seconds; the exporter answers from its cache, a slow one is unwell
NOT_GPU = ("nvlink", "nvswitch", "cpu", "cpucore")   # labels of other entities' series


def metrics_url(url: str) -> str:
    """The exporter's metrics URL: `host:9400` and `http://host:9400` mean its /metrics."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"dcgm_exporter: {url!r} is not an http(s) URL; give the exporter's "
                         "address, e.g. --dcgm-exporter http://localhost:9400/metrics")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class Scrape:
    """One exporter answer, by the exporter's `gpu` label."""

    def __init__(self, text: str):
        self.values: dict[str, dict[str, float]] = {}
        self.uuids: dict[str, str] = {}
        self.hosts: set[str] = set()
        self.mig_series = 0
        for family in text_string_to_metric_families(text):
            # the parser names counter samples <name>_total; the family keeps the field name
            names = (family.name, f"{family.name}_total")
            for s in family.samples:
                if s.name not in names:
                    continue
                labels = s.labels
                gpu = labels.get("gpu")
                if gpu is None or any(k in labels for k in NOT_GPU):
                    continue
                if labels.get("GPU_I_ID", "") != "":
                    self.mig_series += 1
                    continue
                uuid = labels.get("UUID") or labels.get("uuid")
                if uuid:
                    self.uuids.setdefault(gpu, uuid)
                host = labels.get("Hostname") or labels.get("hostname")
                if host:
                    self.hosts.add(host)
                # with HPC job mapping each job on a GPU repeats the GPU's series: the first
                self.values.setdefault(gpu, {}).setdefault(family.name, float(s.value))


class ExporterTelemetry(Polled):
    """Health and utilization of a host's GPUs from its dcgm-exporter. GPUs are matched to
    the model's by UUID when the model has them (discovered with NVML), else by the
    exporter's `gpu` label (a --declared host)."""

    def __init__(self, url: str, topology: Topology, max_temperature: float | None = None,
                 timeout: float = TIMEOUT, poll: float = 5.0):
        super().__init__(poll)
        self.url = metrics_url(url)
        self.state = DcgmGpus(topology, max_temperature)
        uuids = {g.uuid: g.index for g in topology.gpus if g.uuid}
        self.by_uuid = uuids if len(uuids) == len(topology.gpus) else None
        self.client = httpx.Client(timeout=timeout, follow_redirects=True)
        self.failures = 0
        self._warned: set[str] = set()

    def close(self) -> None:
        self.client.close()

    def fetch(self) -> Scrape | None:
        """The exporter's answer, or None (and a warning when it stops answering)."""
        started = time.monotonic()
        try:
            r = self.client.get(self.url)
            r.raise_for_status()
            scrape = Scrape(r.text)
        except (httpx.HTTPError, ValueError) as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("dcgm-exporter at %s cannot be read (%s); GPU health stays as it "
                            "was and no utilization is reported until it answers", self.url,
                            exc or type(exc).__name__)
            return None
        log.debug("dcgm-exporter at %s read in %.0f ms: %d GPUs, %d bytes", self.url,
                  (time.monotonic() - started) * 1000, len(scrape.values), len(r.content))
        if self.failures:
            log.info("dcgm-exporter at %s answers again after %d failed reads", self.url,
                        self.failures)
            self.failures = 0
        if scrape.mig_series:
            self._once("mig", "dcgm-exporter at %s reports %d MIG instance series; they are "
                       "not read (the GPUs' own series are)", self.url, scrape.mig_series)
        return scrape

    def _once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _index(self, gpu: str, scrape: Scrape) -> int | None:
        if self.by_uuid is not None:
            index = self.by_uuid.get(scrape.uuids.get(gpu, ""))
        else:
            index = int(gpu) if gpu.isdigit() and int(gpu) in self.state.last else None
        if index is None:
            self._once(f"gpu{gpu}", "dcgm-exporter at %s reports GPU %s (%s), which this "
                       "host's model does not have; ignored", self.url, gpu,
                       scrape.uuids.get(gpu, "no UUID"))
        return index

    def _read(self) -> list[dict]:
        scrape = self.fetch()
        if scrape is None:
            return self.state.report(None)
        values: dict[int, dict[str, float]] = {}
        uuids: dict[int, str] = {}
        for gpu, v in scrape.values.items():
            index = self._index(gpu, scrape)
            if index is not None:
                values[index] = v
                if gpu in scrape.uuids:
                    uuids[index] = scrape.uuids[gpu]
        return self.state.report(values, uuids)
