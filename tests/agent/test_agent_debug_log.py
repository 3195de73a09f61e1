"""`airflow-gpu agent --log-level debug` says what it read and what it reported: one line
per dcgm-exporter read and one per heartbeat, so a wrong figure in `cluster` can be
traced to the exporter or to the agent. Run as users run it (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.agent.dcgmexporter import DcgmExporterStub
from tests.agent.test_agent_service import Stack
from tests.helpers import REPO


@pytest.fixture
def stub():
    with DcgmExporterStub() as s:
        yield s


def agent(stack: Stack, stub: DcgmExporterStub, level: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "airflow_gpu.cli", "agent", "--server", stack.server.url,
         "--token", stack.admin_token, "--declared", "dgx-a100", "--dcgm-exporter",
         stub.url, "--name", "sim-01", "--once", "--log-level", level],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_debug_logs_each_exporter_read_and_each_report(tmp_path, stub):
    stack = Stack(f"sqlite:///{tmp_path / 'agent.db'}", tmp_path)
    try:
        stub.set(3, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)
        logged = agent(stack, stub, "debug")
        read = [x for x in logged.splitlines() if f"dcgm-exporter at {stub.url}" in x
                and " read in " in x]
        assert read and "DEBUG" in read[0] and ": 8 GPUs, " in read[0], logged
        report = [x for x in logged.splitlines() if "reporting sim-01: " in x]
        assert len(report) == 1 and "DEBUG" in report[0], logged
        assert ("8 GPUs, 7 healthy (GPU 3: row remapping failed; the GPU needs service); "
                "utilization % 97 95 88 0 0 0 0 0") in report[0]
        quiet = agent(stack, stub, "info")
        assert "reporting sim-01" not in quiet and " read in " not in quiet
    finally:
        stack.close()
