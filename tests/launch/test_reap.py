"""Orphan containers on a Docker engine that two scheduler-core deployments share: an
operator removes those its own scheduler no longer runs, never the other's (whose jobs
it does not know: unknown, not dead), nor one that names no scheduler. Real containers on
the machine's engine."""

from __future__ import annotations

import contextlib
import logging
import uuid

import docker
import pytest

from airflow_gpu.launch.docker import SCHEDULER_LABEL, reap_orphans


@pytest.fixture
def engine(image):
    client, made = docker.from_env(), []

    def container(job: str, scheduler: str | None):
        labels = {"airflow-gpu.job": job}
        if scheduler:
            labels[SCHEDULER_LABEL] = scheduler
        made.append(client.containers.create(image, ["true"], labels=labels,
                                             network_mode="none"))
        return made[-1]

    client.container = container
    yield client
    for c in made:
        with contextlib.suppress(docker.errors.NotFound):
            c.remove(force=True)
    client.close()


def exists(client, c) -> bool:
    try:
        client.containers.get(c.id)
        return True
    except docker.errors.NotFound:
        return False


def test_reap_removes_only_its_own_schedulers_dead_jobs_containers(engine):
    me, other = f"http://127.0.0.1:{uuid.uuid4().int % 50000 + 10000}", "http://scheduler-b.example:8793"
    dead = engine.container(f"dead-{uuid.uuid4().hex[:6]}", me)
    live = engine.container(f"live-{uuid.uuid4().hex[:6]}", me)
    theirs = engine.container(f"theirs-{uuid.uuid4().hex[:6]}", other)
    nobodys = engine.container(f"nobodys-{uuid.uuid4().hex[:6]}", None)
    reap_orphans(engine, lambda job: job.startswith("live-") or not job.startswith(
        ("dead-", "theirs-", "nobodys-")), logging.getLogger("test"), me)
    assert not exists(engine, dead)
    assert exists(engine, live)
    assert exists(engine, theirs)         # another deployment's: unknown here, not dead
    assert exists(engine, nobodys)        # names no scheduler: not provably this one's
