"""Builders shared by the tests: small clusters and jobs from the real host models."""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow_gpu.scheduler_core.engine.cluster import ClusterFile, build_cluster
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.jobspec import JobSpec

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# for the processes the tests start: this checkout's code, even where the environment's
# editable install points at another checkout
PYTHONPATH = os.pathsep.join((str(REPO / "src"), str(REPO)))


def make_cluster(*hosts: dict, name: str = "test"):
    return build_cluster(ClusterFile.model_validate({"cluster": name, "hosts": list(hosts)}))


def make_state(*hosts: dict) -> ClusterState:
    return ClusterState(make_cluster(*hosts))


def job(name: str, *roles: dict, **fields) -> JobSpec:
    return JobSpec.model_validate({"name": name, "roles": list(roles), **fields})


def admit(state: ClusterState, spec: JobSpec):
    """Place `spec` with the built-in plugins and commit it; fail with the reason if it
    does not fit now."""
    from airflow_gpu.scheduler_core.engine.placement import Placed, place
    from airflow_gpu.scheduler_core.plugins import default_registry

    got = place(spec, state, default_registry())
    assert isinstance(got, Placed), getattr(got, "message", got)
    state.commit(spec.name, got.allocations)
    return got.allocations


def until(check, what: str, timeout: float = 20, every: float = 0.05):
    """Poll `check` every `every` seconds until it returns something true (that is
    returned); fail naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < end, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(every)
    return got
