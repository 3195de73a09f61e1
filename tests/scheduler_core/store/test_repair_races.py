"""`db check` and `db repair` read in one snapshot and never delete what a live job may
be using: a damaged allocation is the row fixed (not the correct hold beside it, whose
GPU the next pass would give to another job), and checks and repairs racing a busy
store's admissions and releases find nothing and change nothing."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_gpu.scheduler_core.policy.jobqueue import NameTaken
from airflow_gpu.scheduler_core.service.health import Failures
from airflow_gpu.scheduler_core.store import repair
from airflow_gpu.scheduler_core.store.models import AllocationRow, EventRow, GpuHoldRow
from tests.clirun import cli
from tests.databases import HOSTS, serve
from tests.scheduler_core.store.test_bad_rows import auth, job, placed, submit


@pytest.fixture
def api(db_url):
    yield from serve(db_url)


def holders(api, host: str, gpu: int) -> set[str]:
    """The jobs whose live allocations or holds name that GPU."""
    with Session(api.service.engine) as s:
        live = {a.job_id for a in s.scalars(select(AllocationRow).where(
            AllocationRow.live.is_(True), AllocationRow.host == host)) if gpu in a.gpus}
        return live | set(s.scalars(select(GpuHoldRow.job_id).where(
            GpuHoldRow.host == host, GpuHoldRow.gpu == gpu)))


def test_a_damaged_allocation_is_fixed_and_the_hold_beside_it_kept(api, db_url, tmp_path):
    j = submit(api, "j", 1)
    full = submit(api, "full", 8)                # the other host: no room there
    api.tick()
    where, host = placed(api, j), placed(api, j)["host"]
    gpu = where["gpus"][0]
    assert placed(api, full)["host"] != host
    with Session(api.service.engine) as s, s.begin():      # a hand edit gone wrong
        s.scalars(select(AllocationRow).where(AllocationRow.job_id == j)).one().gpus = [12]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "test", "hosts": list(HOSTS)}))

    # without the cluster, which row is wrong cannot be told: nothing is deleted
    blind = cli("db", "repair", "--db", db_url)
    assert blind.returncode == 1 and blind.stdout.startswith("left: gpu_holds"), blind
    check = cli("db", "check", "--db", db_url, "--cluster", str(cluster))
    assert check.returncode == 1
    assert f"gpu_holds host={host} gpu={gpu} job={j}: allocation" in check.stdout
    assert "allocations" in check.stdout and "it names GPU 12" in check.stdout

    others = [submit(api, f"o{i}", 1) for i in range(7)]
    api.tick()                                   # the pass quarantines the held GPU
    assert holders(api, host, gpu) == {j}

    fixed = cli("db", "repair", "--db", db_url, "--cluster", str(cluster))
    assert fixed.returncode == 0, fixed
    assert fixed.stdout.splitlines() == [
        f"rewritten allocations host={host} allocation=1 job={j} (it names GPU 12, which "
        f"host {host} (dgx-a100) does not have)"]
    assert "1 allocations rewritten" in fixed.stderr
    assert placed(api, j)["gpus"] == [gpu]
    clean = cli("db", "check", "--db", db_url, "--cluster", str(cluster))
    assert clean.returncode == 0 and clean.stdout == "", clean
    for _ in range(2):
        api.tick()
    more = [submit(api, f"m{i}", 1) for i in range(3)]
    api.tick()
    assert holders(api, host, gpu) == {j}        # never given to another job
    assert job(api, j)["state"] == "admitted"
    admitted = [o for o in [*others, *more] if job(api, o)["state"] == "admitted"]
    assert len(admitted) == 7                    # the host's 7 other GPUs
    assert all(placed(api, o)["host"] == host for o in admitted)


def test_check_and_repair_racing_admissions_find_nothing(api, db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite's transactions are one snapshot with one writer")
    svc = api.service
    stop, failures = threading.Event(), []

    def submitter():
        rng = random.Random(7)
        try:
            live = []
            for i in range(400):
                if stop.is_set():
                    return
                live.append(submit(api, f"r{i}", rng.choice((1, 1, 2)), cpus=rng.choice((1, 4))))
                if len(live) > 12:       # releases too: holds deleted as jobs end
                    gone = live.pop(rng.randrange(len(live)))
                    r = api.delete(f"/api/v1/jobs/{gone}", headers=auth(api))
                    assert r.status_code == 200, r.text
        except Exception as e:          # noqa: BLE001 - told in the main thread
            failures.append(f"submitter: {e!r}")

    def scheduler():
        try:
            while not stop.is_set():
                api.tick()
        except Exception as e:          # noqa: BLE001 - told in the main thread
            failures.append(f"scheduler: {e!r}")

    threads = [threading.Thread(target=submitter), threading.Thread(target=scheduler)]
    for t in threads:
        t.start()
    found, changed = [], []
    try:
        until = time.monotonic() + 8      # the old reads found hundreds by then
        n = 0
        while time.monotonic() < until and threads[0].is_alive():
            n += 1
            found += [f.line() for f in repair.check(svc.engine, lambda s: svc.cluster)]
            if n % 5 == 0:
                out = repair.repair(svc.engine, lambda s: svc.cluster)
                found += [f.line() for f in out.found]
                changed += out.done
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert failures == []
    assert n >= 10, n
    assert found == [] and changed == []
    with Session(svc.engine) as s:
        assert list(s.scalars(select(EventRow.message).where(
            EventRow.kind == "quarantine"))) == []
        assert s.scalar(select(AllocationRow.id).limit(1)) is not None   # it admitted


def test_an_expected_name_conflict_logs_one_line(caplog):
    log = logging.getLogger("test.failures")
    failures = Failures(log)
    with caplog.at_level(logging.ERROR, logger="test.failures"):
        failures.failed(NameTaken("job 'a' is already queued"), "pass", "scheduler")
        failures.failed(RuntimeError("a bug"), "pass", "scheduler")
    conflict, bug = caplog.records
    assert conflict.exc_info is None and "already queued" in conflict.getMessage()
    assert bug.exc_info is not None            # a real failure keeps its traceback
