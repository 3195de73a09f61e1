"""A dcgm-exporter stand-in for the agent's tests: a real HTTP server on loopback that
answers GET /metrics with metric text in dcgm-exporter's format, as a test changed it.

The text starts from tests/agent/data/dcgm-exporter-dgx-a100.txt: the answer of
dcgm-exporter 4.5.3-4.8.2 on a DGX A100 (8x A100-SXM4-40GB, driver 550.54.15) named
dgx-a-01, written with the exporter's render template (HELP and TYPE lines from its
counters file, labels gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION; err_code and err_msg on XIDs; hpc_job from HPC job mapping: GPUs
0-1 run job 4711, GPU 2 is shared by jobs 4712 and 4713, so its series come twice). The
UUIDs and PCI bus ids are the fake NVML's for the dgx-a100 model, so a discovered fake host
and the stand-in name the same GPUs. Counters file: etc/default-counters.csv with the ECC,
NVLink error, DCGM_FI_PROF_SM_ACTIVE lines uncommented and DCGM_FI_DEV_CLOCKS_EVENT_REASONS
and DCGM_FI_DEV_ROW_REMAP_PENDING added (the health rules read them); the A100 reports no
encoder or vGPU values, so those series are absent, as the exporter leaves blank fields out.

Faults are injected by changing values: `set(gpu, field, value)`.
"""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).parent / "data" / "dcgm-exporter-dgx-a100.txt"
SERIES = re.compile(r'^(?P<name>[A-Z0-9_]+)\{gpu="(?P<gpu>\d+)",(?P<labels>[^}]*)\} '
                    r'(?P<value>\S+)$')
# dcgm-exporter's err_msg of the XIDs tests inject (internal/pkg/collector/xid_errors.go)
XID_MSG = {0: "No Error", 13: "Graphics Engine Exception", 31: "GPU memory page fault",
           43: "GPU stopped processing", 48: "Double Bit ECC Error",
           45: "Preemptive cleanup, due to previous errors -- Most likely to see when "
               "running multiple cuda",
           68: "NVDEC0 Exception", 74: "NVLINK Error", 79: "GPU has fallen off the bus",
           109: "Context Switch Timeout Error"}
# HELP and TYPE of series a test may add (fields the recording does not hold)
ADDED = {"DCGM_FI_DEV_RETIRED_PENDING": ("counter", "Total number of pages pending retirement."),
         "DCGM_FI_DEV_SLOWDOWN_TEMP": ("gauge", "Slowdown temperature (in C)."),
         "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gauge", "Current clock throttle reasons.")}


class DcgmExporterStub:
    """`with DcgmExporterStub() as stub:` serves on `stub.url` until the block ends."""

    def __init__(self, text: str | None = None):
        self.lines = (DATA.read_text() if text is None else text).splitlines()
        self.lock = threading.Lock()
        self.requests = 0
        self.status = 200            # a test may make the exporter answer an error
        self.server: ThreadingHTTPServer | None = None
        self.port = 0

    # -- what tests read and change ----------------------------------------------------
    def text(self) -> str:
        with self.lock:
            return "\n".join(self.lines) + "\n"

    def value(self, gpu: int, field: str) -> float | None:
        """The value the stand-in serves for one GPU's field (None: no such series)."""
        with self.lock:
            for line in self.lines:
                m = SERIES.match(line)
                if m and m["name"] == field and int(m["gpu"]) == gpu:
                    return float(m["value"])
        return None

    def set(self, gpu: int, field: str, value: float) -> None:
        """Serve `value` for GPU `gpu`'s `field` (every series of it); a field the text
        lacks is added with the GPU's labels."""
        shown = f"{value:f}" if isinstance(value, float) else str(int(value))
        with self.lock:
            hit = False
            for k, line in enumerate(self.lines):
                m = SERIES.match(line)
                if m and m["name"] == field and int(m["gpu"]) == gpu:
                    labels = m["labels"]
                    if field == "DCGM_FI_DEV_XID_ERRORS":
                        labels = re.sub(r'err_code="\d+",err_msg="[^"]*"',
                                        f'err_code="{int(value)}",err_msg='
                                        f'"{XID_MSG.get(int(value), "Unknown Error")}"', labels)
                    self.lines[k] = f'{field}{{gpu="{gpu}",{labels}}} {shown}'
                    hit = True
            if not hit:
                self._add(gpu, field, shown)

    def _add(self, gpu: int, field: str, shown: str) -> None:
        base = [m["labels"] for m in map(SERIES.match, self.lines)
                if m and m["name"] == "DCGM_FI_DEV_GPU_TEMP" and int(m["gpu"]) == gpu]
        assert base, f"the stand-in has no GPU {gpu}"
        rows = [f'{field}{{gpu="{gpu}",{labels}}} {shown}' for labels in base]
        type_line = f"# TYPE {field} "
        at = next((k for k, line in enumerate(self.lines) if line.startswith(type_line)), None)
        if at is None:
            kind, text = ADDED.get(field, ("gauge", field))
            self.lines += [f"# HELP {field} {text}", f"# TYPE {field} {kind}", *rows]
            return
        while at + 1 < len(self.lines) and not self.lines[at + 1].startswith("#"):
            at += 1
        self.lines[at + 1:at + 1] = rows

    def remove(self, field: str) -> None:
        """Serve no `field` at all (an exporter whose counters file lacks it)."""
        with self.lock:
            self.lines = [line for line in self.lines
                          if not (line.startswith((f"{field}{{", f"# HELP {field} ",
                                                   f"# TYPE {field} ")))]

    def drop(self, gpu: int) -> None:
        """Serve nothing about GPU `gpu` (as when DCGM lost it)."""
        with self.lock:
            self.lines = [line for line in self.lines
                          if not ((m := SERIES.match(line)) and int(m["gpu"]) == gpu)]

    # -- the server --------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> DcgmExporterStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:            # noqa: N802  (http.server's name)
                stub.requests += 1
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                if stub.status != 200:
                    self.send_error(stub.status)
                    return
                body = stub.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving: connections are refused (start() serves again on the same port)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> DcgmExporterStub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
