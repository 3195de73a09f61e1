"""The test image the launch tests run containers from (scripts/ensure-docker.sh loads
it into the local engine)."""

from __future__ import annotations

import subprocess

import pytest

IMAGE = "airflow-gpu-test/busybox:1"


@pytest.fixture(scope="module")
def image():
    try:
        subprocess.run(["docker", "image", "inspect", IMAGE], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"no Docker engine with the test image {IMAGE} (scripts/ensure-docker.sh)")
    return IMAGE
