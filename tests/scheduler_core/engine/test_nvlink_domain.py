"""Multi-node NVLink domains (GB200 NVL72): a locality tier between host and switch."""

import subprocess
import sys

import pytest

from airflow_gpu.scheduler_core.engine.cluster import load_cluster, tier_of_hosts
from airflow_gpu.scheduler_core.engine.placement import Placed, Unplaced, never_fits, place
from airflow_gpu.scheduler_core.engine.state import ClusterState
from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.plugins import default_registry
from airflow_gpu.scheduler_core.simulation.simulator import SimOptions, simulate
from airflow_gpu.scheduler_core.simulation.trace import TraceJob
from tests.helpers import REPO, job, make_cluster

REG = default_registry()
TRAY = "gb200-nvl72-tray"


def nvl36x2():
    """Two NVLink domains, each over two racks of 9 trays with a leaf switch each."""
    return make_cluster(
        {"name": "a1-[01-09]", "model": TRAY, "rack": "a1", "switch": "leaf-a1",
         "nvlink_domain": "nvl-a"},
        {"name": "a2-[01-09]", "model": TRAY, "rack": "a2", "switch": "leaf-a2",
         "nvlink_domain": "nvl-a"},
        {"name": "b1-[01-09]", "model": TRAY, "rack": "b1", "switch": "leaf-b1",
         "nvlink_domain": "nvl-b"},
        {"name": "b2-[01-09]", "model": TRAY, "rack": "b2", "switch": "leaf-b2",
         "nvlink_domain": "nvl-b"})


def gang(name: str, trays: int, **placement):
    return job(name, {"name": "w", "replicas": trays, "gpus": 4, "cpus": 8, "memory": "16GiB"},
               placement=placement)


def hold(state: ClusterState, name: str, hosts: list[str]) -> None:
    """A running job that holds these whole trays (placed where only they are usable)."""
    scratch = state.empty_like()
    for h in state.cluster.hosts:
        if h.name not in hosts:
            scratch.set_drained(h.name)
    got = place(gang(name, len(hosts)), scratch, REG)
    assert isinstance(got, Placed)
    state.commit(name, got.allocations)


def domains_of(placed: Placed) -> set:
    return {a.host.nvlink_domain for a in placed.allocations}


# -- placement -----------------------------------------------------------------------------
def test_a_gang_larger_than_a_rack_stays_in_one_domain():
    state = ClusterState(nvl36x2())
    # nvl-a is fuller, so the tightest racks are there: 12 free trays over a1 and a2
    hold(state, "busy", [f"a1-0{i}" for i in range(1, 4)] + [f"a2-0{i}" for i in range(1, 4)])
    got = place(gang("big", 12), state, REG)      # 48 GPUs: more than one rack holds
    assert isinstance(got, Placed)
    assert domains_of(got) == {"nvl-a"}
    assert len({a.host.rack for a in got.allocations}) == 2
    assert got.tier == 0                          # runs as on one host


def test_the_domain_that_holds_the_gang_is_taken_over_a_tighter_one():
    state = ClusterState(nvl36x2())
    hold(state, "busy", [f"a1-0{i}" for i in range(1, 10)] + ["a2-01", "a2-02"])
    # nvl-a has 7 free trays, nvl-b 18: a 10-tray gang goes to nvl-b whole
    got = place(gang("ten", 10), state, REG)
    assert domains_of(got) == {"nvl-b"}
    # a 7-tray gang takes the tighter domain that holds it
    got = place(gang("seven", 7), state, REG)
    assert domains_of(got) == {"nvl-a"}


def test_locality_nvlink_domain_is_hard_and_waits_with_a_reason():
    state = ClusterState(nvl36x2())
    hold(state, "a", [f"a1-0{i}" for i in range(1, 10)])
    hold(state, "b", [f"b1-0{i}" for i in range(1, 6)])
    # 72 GPUs free in all (9 + 9 trays) but at most 52 in one domain
    want = gang("big", 14, locality="nvlink_domain")
    got = place(want, state, REG)
    assert isinstance(got, Unplaced)
    assert got.code == "Locality"
    assert "needs w 14x(4 GPUs, 8 CPUs, 16GiB) under one NVLink domain" in got.message
    assert ("the largest free NVLink domain, nvl-b, has 52 eligible GPUs free on 18 hosts"
            in got.message)
    assert "but not under one NVLink domain" in got.message
    assert got.details["best"] == "nvl-b" and got.details["best_free_gpus"] == 52
    # locality any does not wait: it spreads over both domains
    soft = place(gang("soft", 14), state, REG)
    assert isinstance(soft, Placed) and domains_of(soft) == {"nvl-a", "nvl-b"}
    assert soft.tier == 2


def test_a_gang_no_domain_can_ever_hold_is_rejected_naming_the_largest():
    empty = ClusterState(nvl36x2())
    why = never_fits(gang("huge", 19, locality="nvlink_domain"), empty, REG)
    assert why == ("the whole job (w 19x(4 GPUs, 8 CPUs, 16GiB)) must fit one NVLink domain, "
                   "and even an empty NVLink domain cannot hold it: the largest, nvl-a, has "
                   "72 eligible GPUs on 18 hosts; relax placement.locality or shrink the job")
    assert never_fits(gang("fits", 18, locality="nvlink_domain"), empty, REG) is None


def test_pending_reason_from_a_scheduling_pass(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "hosts:\n"
        f"  - {{name: 'r1-[01-18]', model: {TRAY}, rack: r1, nvlink_domain: nvl72-r1}}\n"
        f"  - {{name: 'r2-[01-18]', model: {TRAY}, rack: r2, nvlink_domain: nvl72-r2}}\n")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n"
        "  - {name: first, priority: 9, expected_runtime: 1h,\n"
        "     roles: [{name: w, replicas: 10, gpus: 4}]}\n"
        "  - {name: second, priority: 8, expected_runtime: 1h,\n"
        "     roles: [{name: w, replicas: 10, gpus: 4}]}\n"
        "  - {name: third, priority: 1, placement: {locality: nvlink_domain},\n"
        "     roles: [{name: w, replicas: 10, gpus: 4}]}\n")
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "plan", "--cluster",
                          str(cluster), "--jobs", str(jobs), "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout)
    admitted = {j["job"]: {r["host"][:2] for r in j["replicas"]} for j in data["admitted"]}
    assert admitted == {"first": {"r1"}, "second": {"r2"}}     # each in one domain
    (third,) = data["pending"]
    assert third["job"] == "third"
    assert "under one NVLink domain" in third["reason"]
    assert "the largest free NVLink domain, nvl72-r1, has 32 eligible GPUs" in third["reason"]
    assert third["eta_seconds"] == 3600


# -- hosts without a domain ----------------------------------------------------------------
H100 = ({"name": "h-[1-4]", "model": "dgx-h100", "rack": "r1", "switch": "s1"},
        {"name": "g-[1-4]", "model": "dgx-h100", "rack": "r1", "switch": "s2"})


def test_hosts_without_a_domain_place_as_before():
    state = ClusterState(make_cluster(*H100))
    assert state.cluster.nvlink_domains == {} and state.domain_free == {}
    got = place(job("j", {"name": "w", "replicas": 3, "gpus": 8}), state, REG)
    assert [a.host.name for a in got.allocations] == ["h-1", "h-2", "h-3"]
    assert got.tier == 1
    assert tier_of_hosts([state.cluster.by_name["h-1"], state.cluster.by_name["g-1"]]) == 2
    # locality nvlink_domain: each host is a domain of its own
    one = place(job("one", {"name": "w", "replicas": 2, "gpus": 4},
                    placement={"locality": "nvlink_domain"}), state, REG)
    assert isinstance(one, Placed) and len({a.host.name for a in one.allocations}) == 1
    two = place(job("two", {"name": "w", "replicas": 2, "gpus": 8},
                    placement={"locality": "nvlink_domain"}), state, REG)
    assert isinstance(two, Unplaced)
    assert "no host is in a multi-node NVLink domain (cluster file: nvlink_domain)" in (
        two.message)


def test_tier_of_hosts():
    c = nvl36x2()
    a1, a2, b1 = (c.by_name[n] for n in ("a1-01", "a2-01", "b1-01"))
    assert tier_of_hosts([a1]) == 0
    assert tier_of_hosts([a1, a2]) == 0           # one domain over two racks
    assert tier_of_hosts([a1, b1]) == 2           # across domains and switches


# -- the simulator's slowdown --------------------------------------------------------------
def test_simulated_runtime_follows_the_domain():
    c = nvl36x2()
    trace = [TraceJob("in-domain", 0, 1000, 48)]
    res = simulate(c, trace, SimOptions(slowdown=(1.0, 1.1, 1.3)))
    (rec,) = res.records
    assert rec.end - rec.start == 1000            # 12 trays on NVLink: as one host
    # the same gang when the scheduler does not know the domains and splits it
    blind = make_cluster(
        {"name": "a1-[01-09]", "model": TRAY, "rack": "a1", "switch": "leaf-a1"},
        {"name": "b1-[01-09]", "model": TRAY, "rack": "b1", "switch": "leaf-b1"},
        {"name": "a2-[01-09]", "model": TRAY, "rack": "a2", "switch": "leaf-a2"},
        {"name": "b2-[01-09]", "model": TRAY, "rack": "b2", "switch": "leaf-b2"})
    res = simulate(blind, trace, SimOptions(slowdown=(1.0, 1.1, 1.3), true_cluster=c))
    (rec,) = res.records
    assert rec.end - rec.start == pytest.approx(1300)    # a1 + b1: across domains


# -- the cluster file ----------------------------------------------------------------------
def plan_error(tmp_path, hosts: str) -> str:
    cluster = tmp_path / "c.yaml"
    cluster.write_text("hosts:\n" + hosts)
    jobs = tmp_path / "j.yaml"
    jobs.write_text("jobs:\n  - {name: j, roles: [{name: w, gpus: 1}]}\n")
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.cli", "plan", "--cluster",
                          str(cluster), "--jobs", str(jobs)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    return out.stderr


def test_a_bad_domain_name_is_refused_naming_field_value_and_fix(tmp_path):
    err = plan_error(tmp_path, f"  - {{name: n1, model: {TRAY}, nvlink_domain: 'rack 1'}}\n")
    assert "hosts[0].nvlink_domain" in err
    assert "'rack 1' is not an NVLink domain name" in err
    assert "use letters, digits and . _ : / -" in err and "e.g. nvl72-rack-1" in err


def test_a_domain_on_a_model_without_off_host_nvlink_is_refused(tmp_path):
    err = plan_error(tmp_path, "  - {name: 'h[1-2]', model: dgx-b200, nvlink_domain: d1}\n")
    assert "hosts[0].nvlink_domain: 'd1' is set on host 'h1'" in err
    assert "its model dgx-b200 has no NVLink beyond the host" in err
    assert "leave nvlink_domain out" in err


def test_a_domain_with_more_gpus_than_the_model_allows_is_refused(tmp_path):
    err = plan_error(tmp_path,
                     f"  - {{name: 'r1-[01-18]', model: {TRAY}, nvlink_domain: nvl72-r1}}\n"
                     f"  - {{name: r1-19, model: {TRAY}, nvlink_domain: nvl72-r1}}\n")
    assert "hosts[1].nvlink_domain: 'nvl72-r1' holds 76 GPUs on 19 hosts" in err
    assert "holds at most 72" in err and "split the hosts over more domains" in err


def test_a_host_range_sets_the_domain_of_every_host():
    c = load_cluster("gb200-nvl72")        # two 18-tray ranges, one domain each
    assert {k: len(v) for k, v in c.nvlink_domains.items()} == {
        "nvl72-rack-1": 18, "nvl72-rack-2": 18}
    assert all(h.nvlink_domain == "nvl72-rack-1" for h in c.hosts[:18])
    with pytest.raises(InputError, match="holds 144 GPUs on 36 hosts"):
        make_cluster({"name": "r[1-2]-t[01-18]", "model": TRAY, "nvlink_domain": "big"})
