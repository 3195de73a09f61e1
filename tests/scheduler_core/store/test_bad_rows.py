"""Wrong hold rows (a hold of an ended or missing job, or one no live allocation has) no
longer stop every scheduling pass: what they hold is quarantined (cluster view, /readyz,
/metrics, one event) and jobs are placed elsewhere; `airflow-gpu db check` lists them and
`db repair` deletes them, after which what they held takes work again. SQLite and
PostgreSQL, the real app and the real CLI."""

from __future__ import annotations

import sqlite3

import pytest
import yaml
from rich.console import Console
from sqlalchemy import create_engine, delete, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from airflow_gpu.cli.commands.slurm_command import cluster_table
from airflow_gpu.scheduler_core.store.models import (
    AllocationRow,
    CpuHoldRow,
    EventRow,
    GpuHoldRow,
    MigHoldRow,
)
from tests.clirun import cli
from tests.databases import HOSTS, serve

GHOST = "00000000-0000-4000-8000-000000000000"      # a job id no job has


def submit(api, name: str, gpus: int, cpus: int = 1) -> str:
    r = api.post("/api/v1/jobs", headers=auth(api), json={"spec": {
        "name": name, "expected_runtime": "1h",
        "roles": [{"name": "w", "gpus": gpus, "cpus": cpus}]}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def auth(api, who: str = "vision") -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def job(api, job_id: str) -> dict:
    return api.get(f"/api/v1/jobs/{job_id}", headers=auth(api)).json()


def placed(api, job_id: str) -> dict:
    """The job's one allocation: host, gpus, cpus."""
    with Session(api.service.engine) as s:
        a = s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)).one()
        return {"host": a.host, "gpus": list(a.gpus), "cpus": list(a.cpus)}


def events(api, kind: str = "quarantine") -> list[str]:
    with Session(api.service.engine) as s:
        return list(s.scalars(select(EventRow.message).where(EventRow.kind == kind)
                              .order_by(EventRow.id)))


@pytest.fixture
def api(db_url):
    yield from serve(db_url)


def test_an_ended_jobs_gpu_hold_is_quarantined_then_repaired(api, db_url):
    a = submit(api, "a", 1)
    api.tick()
    where = placed(api, a)
    host, gpu = where["host"], where["gpus"][0]
    assert api.delete(f"/api/v1/jobs/{a}", headers=auth(api)).status_code == 200
    # the hold stays behind (a crash between two writes of an older version, a hand edit)
    with Session(api.service.engine) as s, s.begin():
        s.add(GpuHoldRow(host=host, gpu=gpu, job_id=a))

    b = submit(api, "b", 1)          # the engine would put it where `a` was
    for _ in range(3):
        api.tick()                   # no pass fails
    assert job(api, b)["state"] == "admitted"
    assert (placed(api, b)["host"], placed(api, b)["gpus"]) != (host, [gpu])
    other = submit(api, "c", 8)      # the other host is whole: placed there
    blocked = submit(api, "d", 8)    # this host has 6 GPUs to give (b, the quarantine)
    api.tick()
    assert job(api, other)["state"] == "admitted"
    assert placed(api, other)["host"] != host
    assert job(api, blocked)["state"] == "pending"

    view = api.get("/api/v1/cluster", headers=auth(api)).json()
    h = next(x for x in view["hosts"] if x["name"] == host)
    why = h["gpus"][gpu]["quarantined"]
    assert a in why and "airflow-gpu db repair" in why, why
    assert [q["job"] for q in view["quarantined"]] == [a]
    assert view["quarantined"][0]["problem"] == f"its job {a} is cancelled, so nothing " \
        "may be held for it"
    assert h["free_gpus"] == 6 and h["gpus_unavailable"] == 1
    shown = Console(width=400, record=True)
    shown.print(cluster_table(view))
    assert f"quarantined gpu_holds {gpu}: orphan hold (its job {a} is" in shown.export_text()
    ready = api.get("/readyz").json()
    assert ready["status"] == "ready" and ready["quarantined"][0]["gpu"] == gpu
    metrics = api.get("/metrics").text
    assert f'airflow_gpu_gpus_quarantined{{host="{host}"}} 1.0' in metrics
    told = events(api)
    assert len(told) == 1 and f"GPU {gpu} of host {host} is quarantined" in told[0]

    check = cli("db", "check", "--db", db_url)
    assert check.returncode == 1, check.stderr
    assert check.stdout.splitlines() == [
        f"gpu_holds host={host} gpu={gpu} job={a}: its job {a} is cancelled, so nothing "
        "may be held for it; fix: delete it: airflow-gpu db repair"]
    dry = cli("db", "repair", "--db", db_url, "--dry-run")
    assert dry.returncode == 1 and "would have deleted gpu_holds" in dry.stdout, dry
    assert cli("db", "check", "--db", db_url).returncode == 1      # nothing changed

    api.delete(f"/api/v1/jobs/{b}", headers=auth(api))
    api.tick()
    assert job(api, blocked)["state"] == "pending"      # 7 of 8: still quarantined
    fixed = cli("db", "repair", "--db", db_url)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.startswith(f"deleted gpu_holds host={host} gpu={gpu} job={a}")
    clean = cli("db", "check", "--db", db_url)
    assert clean.returncode == 0 and clean.stdout == "", clean
    api.tick()
    assert job(api, blocked)["state"] == "admitted"     # the GPU takes work again
    assert gpu in placed(api, blocked)["gpus"] and placed(api, blocked)["host"] == host
    assert len(events(api)) == 2 and "is fixed" in events(api)[1]
    assert api.get("/api/v1/cluster", headers=auth(api)).json()["quarantined"] == []
    assert f'airflow_gpu_gpus_quarantined{{host="{host}"}} 0.0' in api.get("/metrics").text


def _insert_bypassing_foreign_keys(db_url: str, engine, rows: list[tuple]) -> None:
    """cpu_holds rows of a job that does not exist, as the sqlite3 shell (foreign keys
    off) or a PostgreSQL restore with triggers disabled lets one in."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.executemany("INSERT INTO cpu_holds (host, cpu, job_id) VALUES (?, ?, ?)", rows)
        conn.commit()
        conn.close()
        return
    with engine.begin() as conn:    # a superuser only: the FK triggers are skipped
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text("INSERT INTO cpu_holds (host, cpu, job_id) VALUES "
                          "(:h, :c, :j)"), [{"h": h, "c": c, "j": j} for h, c, j in rows])


def test_a_hold_of_a_missing_job_needs_the_foreign_keys_off(api, db_url):
    engine = create_engine(api.service.engine.url)
    with pytest.raises(IntegrityError), Session(api.service.engine) as s, s.begin():
        s.add(CpuHoldRow(host="dgx-1", cpu=0, job_id=GHOST))    # refused while enforced
    p = submit(api, "probe", 1, cpus=4)
    api.tick()
    where = placed(api, p)
    api.delete(f"/api/v1/jobs/{p}", headers=auth(api))
    _insert_bypassing_foreign_keys(db_url, engine,
                                   [(where["host"], c, GHOST) for c in where["cpus"]])
    again = submit(api, "again", 1, cpus=4)     # would take those very cores
    api.tick()
    assert job(api, again)["state"] == "admitted"
    assert not set(placed(api, again)["cpus"]) & set(where["cpus"]) \
        or placed(api, again)["host"] != where["host"]
    view = api.get("/api/v1/cluster", headers=auth(api)).json()
    assert sorted(q["cpu"] for q in view["quarantined"]) == sorted(where["cpus"])
    assert all(q["problem"] == f"its job {GHOST} does not exist" for q in view["quarantined"])
    check = cli("db", "check", "--db", db_url)
    assert check.returncode == 1 and len(check.stdout.splitlines()) == len(where["cpus"])
    assert check.stdout.startswith(f"cpu_holds host={where['host']} cpu=")
    repaired = cli("db", "repair", "--db", db_url)
    assert repaired.returncode == 0 and len(repaired.stdout.splitlines()) == 4, repaired
    assert cli("db", "check", "--db", db_url).returncode == 0
    engine.dispose()


def test_check_against_the_cluster_finds_indexes_the_host_lacks(api, db_url, tmp_path):
    j = submit(api, "j", 1)
    api.tick()
    where = placed(api, j)
    # the host's model shrank under a live job, say: a GPU it no longer has
    with Session(api.service.engine) as s, s.begin():
        a = s.scalars(select(AllocationRow).where(AllocationRow.job_id == j)).one()
        a.gpus = [*a.gpus, 12]
        s.add(GpuHoldRow(host=where["host"], gpu=12, job_id=j))
    api.tick()                                  # passes go on
    assert cli("db", "check", "--db", db_url).returncode == 0       # consistent rows
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": "test", "hosts": list(HOSTS)}))
    check = cli("db", "check", "--db", db_url, "--cluster", str(cluster))
    assert check.returncode == 1
    assert check.stdout.splitlines() == [
        f"gpu_holds host={where['host']} gpu=12 job={j}: host {where['host']} (dgx-a100) "
        "has 8 GPUs (0-7); fix: delete it: airflow-gpu db repair",
        f"allocations host={where['host']} allocation=1 job={j}: it names GPU 12, which "
        f"host {where['host']} (dgx-a100) does not have; fix: airflow-gpu db repair makes "
        f"it name GPUs {where['gpus']} and cores {where['cpus']} (what the job's hold rows "
        "there hold)"]
    assert cli("db", "repair", "--db", db_url, "--cluster", str(cluster)).returncode == 0
    assert cli("db", "check", "--db", db_url, "--cluster", str(cluster)).returncode == 0


MIG_HOSTS = ({"name": "dgx-m", "model": "dgx-a100", "rack": "r1", "switch": "s1",
              "mig": [{"gpus": [0], "layout": ["3g.20gb", "3g.20gb"]}]},)


def mig_job(api, name: str) -> str:
    r = api.post("/api/v1/jobs", headers=auth(api), json={"spec": {
        "name": name, "expected_runtime": "1h",
        "roles": [{"name": "w", "cpus": 1, "gpu": {"mig": "3g.20gb"}}]}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_an_orphan_mig_hold_quarantines_that_device_only(db_url):
    for api in serve(db_url, hosts=MIG_HOSTS):
        first = mig_job(api, "first")
        api.tick()
        with Session(api.service.engine) as s:
            device = s.scalars(select(AllocationRow).where(
                AllocationRow.job_id == first)).one().mig[0]["index"]
        api.delete(f"/api/v1/jobs/{first}", headers=auth(api))
        with Session(api.service.engine) as s, s.begin():
            s.add(MigHoldRow(host="dgx-m", gpu=0, device=device, job_id=first))
        second, third = mig_job(api, "second"), mig_job(api, "third")
        api.tick()
        assert job(api, second)["state"] == "admitted"       # on the other device
        assert job(api, third)["state"] == "pending"         # the quarantined one is not
        view = api.get("/api/v1/cluster", headers=auth(api)).json()
        gpu0 = view["hosts"][0]["gpus"][0]
        assert "airflow-gpu db repair" in gpu0["quarantined"]
        assert view["quarantined"][0]["device"] == device
        assert 'airflow_gpu_gpus_quarantined{host="dgx-m"} 1.0' in api.get("/metrics").text
        check = cli("db", "check", "--db", db_url)
        assert check.returncode == 1
        assert check.stdout.startswith(f"mig_holds host=dgx-m gpu=0 device={device} "
                                       f"job={first}: its job {first} is cancelled")
        assert cli("db", "repair", "--db", db_url).returncode == 0
        api.tick()
        assert job(api, third)["state"] == "admitted"


def test_a_core_hold_its_live_allocation_lacks_is_found_each_pass(api, db_url):
    j = submit(api, "j", 1, cpus=4)
    api.tick()
    where = placed(api, j)
    moved_from = where["cpus"][0]
    moved_to = next(c for c in range(moved_from + 1, 256) if c not in where["cpus"])
    with Session(api.service.engine) as s, s.begin():     # same count, other cores
        a = s.scalars(select(AllocationRow).where(AllocationRow.job_id == j)).one()
        a.cpus = sorted([*where["cpus"][1:], moved_to])
    api.tick()
    # the job's row did not change: the leader finds it at its next check of the store
    view = api.get("/api/v1/cluster", headers=auth(api)).json()
    assert view["quarantined"] == []
    api.service.warm.check_every = 0.0        # the check is due
    api.tick()
    view = api.get("/api/v1/cluster", headers=auth(api)).json()
    # which row is wrong cannot be told: the hold is quarantined, never deleted
    assert [(q["cpu"], q["problem"]) for q in view["quarantined"]] == [
        (moved_from, f"no live allocation of job {j} holds it, and one names core "
         f"{moved_to} instead, which no hold row of the job holds")]
    check = cli("db", "check", "--db", db_url)
    assert check.returncode == 1
    assert check.stdout.startswith(f"cpu_holds host={where['host']} cpu={moved_from} ")
    repaired = cli("db", "repair", "--db", db_url)
    assert repaired.returncode == 1 and repaired.stdout.startswith("left: cpu_holds")
    with Session(api.service.engine) as s:
        assert moved_from in s.scalars(select(CpuHoldRow.cpu).where(
            CpuHoldRow.job_id == j)).all()


def test_a_gpu_held_whole_and_by_a_mig_device_is_listed_not_deleted(db_url):
    for api in serve(db_url, hosts=MIG_HOSTS):
        mig = mig_job(api, "mig")
        whole = submit(api, "whole", 1)
        api.tick()
        # the whole-GPU job's grant rewritten onto the MIG GPU (by hand, say)
        with Session(api.service.engine) as s, s.begin():
            a = s.scalars(select(AllocationRow).where(AllocationRow.job_id == whole)).one()
            s.execute(delete(GpuHoldRow).where(GpuHoldRow.job_id == whole))
            a.gpus = [0]
            s.add(GpuHoldRow(host="dgx-m", gpu=0, job_id=whole))
        api.tick()                                            # passes go on
        device = placed_mig(api, mig)
        check = cli("db", "check", "--db", db_url)
        assert check.returncode == 1
        assert check.stdout.splitlines() == [
            f"mig_holds host=dgx-m gpu=0 device={device} job={mig}: GPU 0 is also held "
            f"whole by job {whole}; fix: cancel job {mig} or job {whole} (airflow-gpu "
            "cancel ID)"]
        left = cli("db", "repair", "--db", db_url)
        assert left.returncode == 1 and left.stdout.startswith("left: mig_holds"), left
        api.delete(f"/api/v1/jobs/{whole}", headers=auth(api))
        assert cli("db", "check", "--db", db_url).returncode == 0


def placed_mig(api, job_id: str) -> int:
    with Session(api.service.engine) as s:
        return s.scalars(select(MigHoldRow.device).where(MigHoldRow.job_id == job_id)).one()
