"""MIG devices as schedulable units: the spec, the cluster file's layouts, placement
(exclusive devices, profiles, NUMA locality, best fit, no whole-GPU job on a MIG GPU),
the pending and never-fits reasons, and `plan`'s output."""

import json
import random

import pytest

from airflow_gpu.cli import main
from airflow_gpu.scheduler_core.engine.cluster import ClusterFile, build_cluster
from airflow_gpu.scheduler_core.engine.mig import FAMILIES, place_layout
from airflow_gpu.scheduler_core.engine.placement import Placed, Unplaced, never_fits, place
from airflow_gpu.scheduler_core.engine.topology import load_topology
from airflow_gpu.scheduler_core.errors import InputError, validate
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.plugins import default_registry
from tests.helpers import job, make_state

REG = default_registry()
A100 = FAMILIES["A100 40GB"]


def mig_host(name="a", model="dgx-a100", mig=None) -> dict:
    return {"name": name, "model": model, "mig": mig or {"gpus": [2], "layout": {"1g.5gb": 7}}}


def mig_job(name, profile="1g.5gb", count=1, replicas=1, cpus=2, **fields):
    role = {"name": "v", "replicas": replicas, "cpus": cpus, "memory": "4GiB",
            "gpu": {"mig": {"profile": profile, "count": count}}}
    return job(name, role, **fields)


def admit(state, spec):
    got = place(spec, state, REG)
    assert isinstance(got, Placed), getattr(got, "message", got)
    state.commit(spec.name, got.allocations)
    return got.allocations


def labels(allocs) -> list[str]:
    return [s.label for a in allocs for s in a.slices]


# -- the spec ------------------------------------------------------------------------------

def test_spec_takes_a_profile_or_a_profile_and_count():
    one = job("v", {"name": "v", "gpu": {"mig": "1g.10gb"}}).roles[0]
    assert (one.gpus, one.gpu.mig.profile, one.gpu.mig.count) == (0, "1g.10gb", 1)
    two = job("w", {"name": "w", "gpu": {"mig": {"profile": "3g.40gb", "count": 2}}})
    assert (two.roles[0].gpu.mig.count, two.total_gpus, two.total_mig_devices) == (2, 0, 2)


@pytest.mark.parametrize("role, words", [
    ({"gpu": {"mig": "3g.30gb"}}, ["gpu.mig.profile", "'3g.30gb'", "did you mean '3g.",
                                   "1g.18gb"]),
    ({"gpus": 1, "gpu": {"mig": "1g.10gb"}}, ["gpu.mig", "remove gpus"]),
    ({"gpu": {"mig": "1g.10gb", "min_memory": "8GiB"}}, ["gpu.min_memory", "1g.10gb"]),
    ({"gpu": {"mig": {"profile": "1g.10gb", "count": 0}}}, ["count"]),
])
def test_spec_errors_name_the_field_the_value_and_the_fix(role, words):
    with pytest.raises(InputError) as exc:
        validate(JobSpec, {"name": "bad", "roles": [{"name": "v", **role}]}, "job.yaml")
    for w in words:
        assert w in str(exc.value), str(exc.value)


# -- layouts and the cluster file ------------------------------------------------------------

def test_layouts_are_checked_against_the_gpus_slices():
    assert place_layout(A100, ["3g.20gb", "2g.10gb", "2g.10gb"]) == [4, 0, 2]
    assert place_layout(A100, ["1g.5gb"] * 7) == list(range(7))
    assert place_layout(A100, ["4g.20gb", "3g.20gb"]) == [0, 4]
    with pytest.raises(ValueError, match="needs 8 compute"):
        place_layout(A100, ["4g.20gb", "4g.20gb"])
    with pytest.raises(ValueError, match="needs 7 compute and 9 memory"):
        place_layout(A100, ["3g.20gb", "3g.20gb", "1g.5gb"])
    with pytest.raises(ValueError, match="cannot be placed"):        # reported placements
        place_layout(A100, ["2g.10gb", "2g.10gb"], [2, 2])
    assert place_layout(A100, ["2g.10gb", "1g.10gb"], [4, None]) == [4, 0]


@pytest.mark.parametrize("mig, words", [
    ({"gpus": [0], "layout": ["4g.20gb", "4g.20gb"]},
     ["hosts[0].mig[0].layout", "GPU 0", "needs 8 compute"]),
    ({"gpus": [0], "layout": ["3g.40gb"]},
     ["hosts[0].mig[0].layout", "'3g.40gb'", "did you mean '3g.20gb'"]),
    ([{"gpus": [0, 1], "layout": ["7g.40gb"]}, {"gpus": [1], "layout": ["7g.40gb"]}],
     ["hosts[0].mig[1].gpus", "GPU 1 is in mig[0] too"]),
    ({"gpus": [9], "layout": ["7g.40gb"]}, ["hosts[0].mig[0].gpus", "no GPU 9"]),
    ({"gpus": [0], "layout": ["4g.20gb"], "strategy": "x"}, ["unknown field 'strategy'"]),
])
def test_cluster_file_layout_errors(mig, words):
    data = {"hosts": [{"name": "a", "model": "dgx-a100", "mig": mig}]}
    with pytest.raises(InputError) as exc:
        build_cluster(validate(ClusterFile, data, "c.yaml"), source="c.yaml")
    for w in words:
        assert w in str(exc.value), str(exc.value)


def test_a_gpu_without_mig_cannot_be_partitioned():
    with pytest.raises(InputError, match="hosts\\[0\\].mig\\[0\\].layout: GPU 0 .*V100.* no MIG"):
        make_state({"name": "v", "model": "dgx-1v", "mig": {"gpus": [0], "layout": ["1g.5gb"]}})


def test_hosts_of_one_layout_share_one_compiled_type():
    state = make_state(mig_host("a-[1-2]"), mig_host("b"), {"name": "c", "model": "dgx-a100"})
    a1, a2, b, c = state.cluster.hosts
    assert a1.type is a2.type is b.type and c.type is not a1.type
    assert a1.type.mig_gpus == 1 << 2 and len(a1.type.mig.slices) == 7
    assert c.type.mig is None


# -- placement -------------------------------------------------------------------------------

def test_each_mig_device_goes_to_one_job_and_the_next_waits_naming_them():
    state = make_state(mig_host())
    got = [labels(admit(state, mig_job(f"v{i}"))) for i in range(7)]
    assert sorted(x for g in got for x in g) == [f"GPU 2 MIG 1g.5gb #{k}" for k in range(7)]
    blocked = place(mig_job("v7"), state, REG)
    assert isinstance(blocked, Unplaced)
    assert "0 free MIG 1g.5gb devices" in blocked.message
    assert "held by v0 (a GPU 2 MIG 1g.5gb #0)" in blocked.message
    assert blocked.details["mig_held_by"]["v3"] == ["a GPU 2 MIG 1g.5gb #3"]
    state.release("v3")
    assert labels(admit(state, mig_job("v8"))) == ["GPU 2 MIG 1g.5gb #3"]


def test_whole_gpu_jobs_never_land_on_a_mig_gpu():
    state = make_state(mig_host(mig={"gpus": [0, 1, 2, 3, 4, 5], "layout": ["7g.40gb"]}))
    (a,) = admit(state, job("two", {"name": "w", "gpus": 2}))
    assert a.gpus == [6, 7] and not a.slices
    assert isinstance(place(job("one", {"name": "w", "gpus": 1}), state, REG), Unplaced)
    why = never_fits(job("three", {"name": "w", "gpus": 3}), state.empty_like(), REG)
    assert "largest host" in why and "has 2 such GPUs" in why     # GPUs 6-7: not MIG ones
    # and MIG jobs never take whole GPUs
    (m,) = admit(state, mig_job("m", "7g.40gb"))
    assert m.gpus == [] and labels([m]) == ["GPU 0 MIG 7g.40gb #0"]


def test_profiles_fit_only_their_own_devices():
    state = make_state(mig_host(mig={"gpus": [0], "layout": ["3g.20gb", "2g.10gb", "2g.10gb"]}))
    assert labels(admit(state, mig_job("big", "3g.20gb"))) == ["GPU 0 MIG 3g.20gb #0"]
    assert isinstance(place(mig_job("big2", "3g.20gb"), state, REG), Unplaced)
    assert labels(admit(state, mig_job("two", "2g.10gb", count=2))) == [
        "GPU 0 MIG 2g.10gb #1", "GPU 0 MIG 2g.10gb #2"]


def test_devices_are_numa_local_to_the_replicas_cores():
    topo = load_topology("dgx-a100")
    numa_of = {g.index: g.numa_node for g in topo.gpus}
    cpus_of = {n.id: set(n.cpus) for n in topo.host.numa_nodes}
    state = make_state(mig_host(mig={"gpus": [0, 4], "layout": {"1g.5gb": 7}}))
    for i in range(14):
        (a,) = admit(state, mig_job(f"v{i}", cpus=4, placement={"affinity": "strict"}))
        (s,) = a.slices
        assert set(a.cpus) <= cpus_of[numa_of[s.gpu]], (s.label, a.cpus)
        assert a.numa_nodes == [numa_of[s.gpu]]


def test_partly_used_mig_gpus_fill_first():
    state = make_state(mig_host(mig={"gpus": [0, 2], "layout": {"1g.5gb": 7}}))
    first = labels(admit(state, mig_job("first")))
    assert first == ["GPU 0 MIG 1g.5gb #0"]
    assert labels(admit(state, mig_job("second"))) == ["GPU 0 MIG 1g.5gb #1"]
    # a host whose MIG GPU is partly used wins over one with untouched MIG GPUs
    state = make_state(mig_host("a"), mig_host("b"))
    b = state.cluster.by_name["b"]
    state.hosts[b.index].free_slices &= ~1        # b's GPU 2 #0 held elsewhere
    (a,) = admit(state, mig_job("third"))
    assert a.host.name == "b" and labels([a]) == ["GPU 2 MIG 1g.5gb #1"]


def test_gangs_of_mig_replicas_spread_over_hosts_all_or_nothing():
    state = make_state(mig_host("a"), mig_host("b"))
    allocs = admit(state, mig_job("gang", replicas=10))
    assert sorted({a.host.name for a in allocs}) == ["a", "b"]
    assert isinstance(place(mig_job("more", replicas=5), state, REG), Unplaced)
    assert sum(hs.free_slices.bit_count() for hs in state.hosts) == 4


def test_no_mig_device_is_granted_twice_under_random_jobs():
    rng = random.Random(7)
    state = make_state(mig_host("a", mig={"gpus": "all", "layout": ["3g.20gb", "2g.10gb",
                                                                    "1g.5gb", "1g.5gb"]}),
                       mig_host("b", mig={"gpus": [0, 1, 2, 3], "layout": {"1g.10gb": 4}}))
    live: list[str] = []
    for i in range(300):
        if live and rng.random() < 0.4:
            state.release(live.pop(rng.randrange(len(live))))
            continue
        profile = rng.choice(["3g.20gb", "2g.10gb", "1g.5gb", "1g.10gb"])
        got = place(mig_job(f"j{i}", profile, count=rng.choice([1, 1, 2]),
                            replicas=rng.choice([1, 2, 3]), cpus=1), state, REG)
        if isinstance(got, Placed):
            state.commit(f"j{i}", got.allocations)
            live.append(f"j{i}")
        held = [(a.host.index, s.slot) for allocs in state.allocations.values()
                for a in allocs for s in a.slices]
        assert len(held) == len(set(held))
        for a in (a for allocs in state.allocations.values() for a in allocs):
            assert not a.slice_mask & state.hosts[a.host.index].free_slices


# -- never fits ------------------------------------------------------------------------------

def test_a_profile_the_cluster_cannot_offer_is_rejected_with_the_profiles_it_has():
    state = make_state(mig_host(), {"name": "b", "model": "dgx-a100"})
    why = never_fits(mig_job("h200", "1g.18gb"), state.empty_like(), REG)
    assert "gpu.mig" in why and "'1g.18gb'" in why and "A100 40GB" in why
    assert "1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb" in why
    why = never_fits(mig_job("unset", "3g.20gb"), state.empty_like(), REG)
    assert "no GPU is partitioned with it" in why and "1g.5gb" in why
    why = never_fits(mig_job("many", replicas=15), state.empty_like(), REG)
    assert "15 devices, but the cluster has 7" in why
    why = never_fits(mig_job("wide", count=8), state.empty_like(), REG)
    assert "largest host has 7" in why


# -- plan ------------------------------------------------------------------------------------

def test_plan_names_the_devices(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(
        "hosts:\n  - name: a\n    model: dgx-a100\n"
        "    mig: [{gpus: [2], layout: {1g.5gb: 7}}]\n")
    (tmp_path / "j.yaml").write_text(
        "jobs:\n  - name: val\n    roles: [{name: v, replicas: 8, cpus: 2,"
        " gpu: {mig: 1g.5gb}}]\n"
        "  - name: one\n    roles: [{name: v, cpus: 2, gpu: {mig: 1g.5gb}}]\n")
    main(["plan", "--cluster", str(tmp_path / "c.yaml"), "--jobs", str(tmp_path / "j.yaml"),
          "--json"])
    out = json.loads(capsys.readouterr().out)
    (admitted,) = out["admitted"]
    assert admitted["job"] == "one"
    (r,) = admitted["replicas"]
    assert r["gpus"] == [] and r["mig"][0]["label"] == "GPU 2 MIG 1g.5gb #0"
    assert r["mig"][0]["uuid"] is None and r["mig"][0]["start"] == 0
    assert out["rejected"][0]["job"] == "val"
    assert "8 devices, but the cluster has 7" in out["rejected"][0]["error"]
