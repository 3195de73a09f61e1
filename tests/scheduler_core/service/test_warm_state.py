"""The leader keeps its scheduling state between passes (service/warm.py): it reads only
the job rows whose revision changed, finds a change made behind its back (a job row at
once, an allocation at its periodic check) and reads its state anew, and a pass whose
write fails leaves nothing of itself in memory. SQLite and PostgreSQL, the real app."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from airflow_gpu.scheduler_core.service import check, storepass, warm
from airflow_gpu.scheduler_core.store.models import AllocationRow, GpuHoldRow, JobRow
from tests.databases import serve
from tests.scheduler_core.store.test_bad_rows import auth, job, placed, submit


@pytest.fixture
def api(db_url):
    yield from serve(db_url)


def rev(api, job_id: str) -> int:
    with Session(api.service.engine) as s:
        return s.scalar(select(JobRow.rev).where(JobRow.id == job_id))


def test_every_update_of_a_job_row_bumps_its_revision_whoever_writes_it(api):
    a = submit(api, "a", 1)
    before = rev(api, a)
    with api.service.engine.begin() as conn:        # a plain statement, not the ORM
        conn.exec_driver_sql(f"UPDATE jobs SET priority = 5 WHERE id = '{a}'")
    assert rev(api, a) == before + 1
    with Session(api.service.engine) as s, s.begin():
        s.get(JobRow, a).priority = 6                   # the ORM
    assert rev(api, a) == before + 2


def test_a_pass_reads_again_only_the_jobs_that_changed(api):
    ids = [submit(api, f"j{i}", 8) for i in range(6)]    # two hosts of 8 GPUs: 2 start
    assert len(api.tick()) == 2
    api.tick()                                          # the reasons, now written
    warm = api.service.warm
    known = {i: warm.jobs[i] for i in ids}
    api.tick()
    assert all(warm.jobs[i] is known[i] for i in ids)  # nothing read again
    waiting = next(i for i in ids if job(api, i)["state"] == "pending")
    with Session(api.service.engine) as s, s.begin():   # behind the service's back
        spec = s.get(JobRow, waiting).spec
        s.execute(update(JobRow).where(JobRow.id == waiting).values(
            priority=50, spec={**spec, "priority": 50}))
    api.tick()
    assert warm.jobs[waiting] is not known[waiting]
    assert api.service.warm.sched.queue.jobs[waiting].spec.priority == 50
    assert [i for i in ids if warm.jobs[i] is not known[i]] == [waiting]
    assert api.service.rebuilt == []


def test_a_heartbeat_that_only_extends_the_lease_keeps_the_revision(api):
    ids = [submit(api, f"j{i}", 8) for i in range(2)]
    assert set(api.tick()) == set(ids)
    a, b = ids
    first = rev(api, a)
    r = api.post(f"/api/v1/jobs/{a}/heartbeat", headers=auth(api, "vision"))
    assert r.status_code == 200 and r.json()["state"] == "running"   # a change: bumped
    assert rev(api, a) == first + 1 and r.json()["replicas"][0]["gpus"]
    api.tick()
    known = api.service.warm.jobs[a]
    lease = r.json()["lease_expires_at"]
    r = api.post(f"/api/v1/jobs/{a}/heartbeat", headers=auth(api, "vision"))
    assert r.status_code == 200 and r.json()["lease_expires_at"] >= lease
    assert rev(api, a) == first + 1                  # only the lease: kept
    api.tick()
    assert api.service.warm.jobs[a] is known         # so the leader read nothing again
    with api.service.engine.begin() as conn:        # any other write still bumps
        conn.exec_driver_sql(f"UPDATE jobs SET priority = 5 WHERE id = '{a}'")
    assert rev(api, a) == first + 2
    before = rev(api, b)
    other = api.post(f"/api/v1/jobs/{b}/heartbeat", headers=auth(api, "nlp"))
    assert other.status_code == 403 and rev(api, b) == before     # another team's: refused
    gone = api.post("/api/v1/jobs/00000000-0000-0000-0000-000000000000/heartbeat",
                    headers=auth(api, "vision"))
    assert gone.status_code == 404


def test_an_allocation_changed_behind_the_leaders_back_is_found_and_read_anew(
        api, monkeypatch):
    a = submit(api, "a", 1)
    assert api.tick() == [a]
    api.tick()                                # the admitted row read back: as stored
    where = placed(api, a)
    moved = next(g for g in range(8) if g not in where["gpus"])
    with Session(api.service.engine) as s, s.begin():    # consistent rows: no quarantine
        s.execute(delete(GpuHoldRow).where(GpuHoldRow.job_id == a))
        row = s.scalars(select(AllocationRow).where(AllocationRow.job_id == a)).one()
        row.gpus = [moved]
        s.add(GpuHoldRow(host=where["host"], gpu=moved, job_id=a))
    api.tick()
    assert api.service.rebuilt == []          # the job row did not change: not seen yet
    api.service.warm.check_every = 0.0        # the check is due
    api.tick()                                # the check compares the holdings
    assert api.service.rebuilt == ["divergence"]
    held = api.service.warm.sched.state.allocations[a]
    assert [g for r in held for g in r.gpus] == [moved]
    b = submit(api, "b", 7)                   # the 7 others on that host: none is `moved`
    api.tick()
    assert job(api, b)["state"] == "admitted"
    assert moved not in placed(api, b)["gpus"] or placed(api, b)["host"] != where["host"]


def test_the_check_reads_a_slice_of_the_hosts_at_a_time(api, monkeypatch):
    """One host a check (SLICE 1 on two hosts): the other host's check finds nothing, the
    whole cluster is checked every CHECK_EVERY (a slice every half of it), and the check
    of the host where the allocation changed finds it."""
    monkeypatch.setattr(check, "SLICE", 1)
    a = submit(api, "a", 1)
    assert api.tick() == [a]
    api.tick()
    where = placed(api, a)
    moved = next(g for g in range(8) if g not in where["gpus"])
    with Session(api.service.engine) as s, s.begin():
        s.execute(delete(GpuHoldRow).where(GpuHoldRow.job_id == a))
        row = s.scalars(select(AllocationRow).where(AllocationRow.job_id == a)).one()
        row.gpus = [moved]
        s.add(GpuHoldRow(host=where["host"], gpu=moved, job_id=a))
    warm = api.service.warm
    names = [h.name for h in warm.cluster.hosts]
    assert len(names) == 2
    warm.check_at = 1 - names.index(where["host"])        # the other host's turn
    warm.check_every = 0.0
    api.tick()
    assert api.service.rebuilt == []
    assert warm.check_every == 30.0            # CHECK_EVERY / 2 slices
    warm.check_every = 0.0
    api.tick()                                 # now the host where it changed
    assert api.service.rebuilt == ["divergence"]
    held = api.service.warm.sched.state.allocations[a]
    assert [g for r in held for g in r.gpus] == [moved]


def test_a_burst_of_submits_is_taken_in_over_passes_the_most_urgent_first(
        api, monkeypatch):
    """At most INTAKE jobs new to the leader a pass (here 2): the rest wait for the next
    passes, unseen (no reason yet), and a high-priority job submitted last goes first."""
    monkeypatch.setattr(warm, "INTAKE", 2)
    first = submit(api, "first", 8)
    assert api.tick() == [first]
    burst = [submit(api, f"b{i}", 8) for i in range(4)]
    r = api.post("/api/v1/jobs", headers=auth(api), json={"spec": {
        "name": "urgent", "expected_runtime": "1h", "priority": 10,
        "roles": [{"name": "w", "gpus": 8}]}})
    assert r.status_code == 201, r.text
    urgent = r.json()["id"]
    assert api.tick() == [urgent]              # the one free host: taken in first
    known = api.service.warm.jobs
    assert urgent in known and [i for i in burst if i in known] == burst[:1]
    assert [job(api, i)["pending"]["code"] for i in burst[1:]] == [None] * 3
    api.tick()
    assert [i for i in burst if i in known] == burst[:3]
    api.tick()
    assert all(i in known for i in burst)
    assert len(api.service.warm.sched.queue) == 4
    assert api.service.rebuilt == []


def test_a_failed_write_leaves_nothing_of_its_pass_in_memory(api, monkeypatch):
    first = submit(api, "first", 8)
    assert api.tick() == [first]
    a, b = submit(api, "a", 8), submit(api, "b", 8)

    real = storepass.admit

    def broken(*args, **kw):
        assert real(*args, **kw)          # the admissions, allocations and holds written
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(storepass, "admit", broken)
    with pytest.raises(RuntimeError):
        api.service.schedule_pass()
    assert api.service.warm is None
    assert job(api, a)["state"] == job(api, b)["state"] == "pending"   # rolled back
    with Session(api.service.engine) as s:
        assert s.scalars(select(AllocationRow.job_id).where(
            AllocationRow.job_id.in_([a, b]))).all() == []
    monkeypatch.undo()
    admitted = api.tick()
    assert api.service.rebuilt == ["leader"]          # read anew from the store
    assert len(admitted) == 1 and admitted[0] in (a, b)
    held = {g for r in api.service.warm.sched.state.allocations[admitted[0]] for g in r.gpus}
    assert len(held) == 8
    r = api.delete(f"/api/v1/jobs/{first}", headers=auth(api))
    assert r.status_code == 200
    assert set(api.tick()) == {a, b} - set(admitted)


def test_a_policy_change_rebuilds_the_engine_from_memory_with_the_running_jobs_held(api):
    """A team's share changed: the engine is built anew from what the leader keeps, the
    running jobs it did not read again still holding their GPUs (else the next job is
    placed on them and the pass's write fails on their holds)."""
    a, b = submit(api, "a", 8), submit(api, "b", 8)     # two hosts of 8 GPUs: full
    assert set(api.tick()) == {a, b}
    api.tick()                                          # read again, as admitted
    r = api.put("/api/v1/teams/vision", json={"share": 3.0}, headers=auth(api, "admin"))
    assert r.status_code == 200, r.text
    c = submit(api, "c", 8)
    assert api.tick() == []
    assert api.service.rebuilt == ["policy"]           # from memory, not from the store
    held = api.service.warm.sched.state.allocations
    assert {len(held[a]), len(held[b])} == {1} and held[a][0].gpu_mask.bit_count() == 8
    assert job(api, c)["state"] == "pending"


def test_checks_take_at_most_their_share_of_the_leaders_time(api, monkeypatch):
    submit(api, "a", 1)
    api.tick()
    warm = api.service.warm
    assert warm.check_every == 60.0            # CHECK_EVERY while checks are short
    monkeypatch.setattr(check, "CHECK_SHARE", 1e-9)
    warm.check_every = 0.0
    before = warm.checked_at
    api.tick()                                 # a check: whatever it took, far over
    assert warm.checked_at > before            # a billionth of the time since
    assert warm.check_every > 60.0
    checked = warm.checked_at
    api.tick()
    assert warm.checked_at == checked          # not due again for a long while
