"""A container handle that removes its exited container on a thread (the Airflow task's,
while it reports the finish) and settles before the task ends."""

from __future__ import annotations

import threading

from airflow_gpu.launch.docker import ContainerHandle
from airflow_gpu.launch.supervise import settle


class Container:
    def __init__(self):
        self.release = threading.Event()
        self.removed_on: threading.Thread | None = None

    def wait(self):
        return {"StatusCode": 3}

    def remove(self, force=False):
        self.release.wait(5)
        self.removed_on = threading.current_thread()


def test_wait_returns_the_code_before_the_removal_and_settle_waits_for_it():
    container = Container()
    handle = ContainerHandle("main-0", container, remove_later=True)
    assert handle.wait() == 3
    assert container.removed_on is None          # still being removed
    container.release.set()
    settle([handle, object()])                   # handles without settle() are skipped
    assert container.removed_on not in (None, threading.main_thread())


def test_by_default_wait_removes_the_container_itself():
    container = Container()
    container.release.set()
    assert ContainerHandle("main-0", container).wait() == 3
    assert container.removed_on is threading.main_thread()
