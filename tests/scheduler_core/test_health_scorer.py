"""Worn GPUs (rising error counts, thermal throttling): scored down, never excluded."""

from __future__ import annotations

import dataclasses
import random

from airflow_gpu.scheduler_core.engine.gpu_selection import ranked_gpu_sets
from airflow_gpu.scheduler_core.engine.placement import Placed, compile_needs, place
from airflow_gpu.scheduler_core.engine.trial import Trial
from airflow_gpu.scheduler_core.healthscore import HealthScorer
from airflow_gpu.scheduler_core.plugins import default_registry, make_registry
from tests.helpers import job, make_state

REG = default_registry()
PLAIN = dataclasses.replace(REG, scorers=[])       # the same registry without any scorer


def admit(state, spec, reg=REG):
    got = place(spec, state, reg)
    assert isinstance(got, Placed), getattr(got, "message", got)
    state.commit(spec.name, got.allocations)
    return got.allocations


def occupy(state, host: str, gpus: list[int], name: str) -> None:
    """Hold `gpus` of `host` for a job named `name` (CPUs and memory stay free)."""
    from airflow_gpu.scheduler_core.engine.state import ReplicaAllocation

    h = state.cluster.by_name[host]
    state.commit(name, [ReplicaAllocation(name, "w", 0, h, sum(1 << g for g in gpus), [], [])])


def gpus_job(name: str, gpus: int, runtime=None, replicas: int = 1, **fields):
    extra = {"expected_runtime": runtime} if runtime is not None else {}
    return job(name, {"name": "w", "gpus": gpus, "replicas": replicas, "cpus": 1,
                      "memory": "1GiB"}, **extra, **fields)


# -- the registry and the state ----------------------------------------------------------

def test_the_health_scorer_is_a_builtin_plugin():
    assert any(isinstance(s, HealthScorer) for s in REG.scorers)
    assert any(isinstance(s, HealthScorer)
               for s in make_registry(entry_points=False).scorers)
    # registered once even when the entry point is installed as well
    assert sum(isinstance(s, HealthScorer) for s in make_registry().scorers) == 1


def test_set_degraded_gpus_keeps_them_usable():
    state = make_state({"name": "h-[1-2]", "model": "dgx-h100"})
    scorer = next(s for s in REG.scorers if isinstance(s, HealthScorer))
    assert not state.any_worn and not scorer.applies(state)
    before = ([dict(b) for b in state.by_free], state.usable_total, state.epoch)
    state.set_degraded_gpus("h-1", {3: "thermal throttling", 1: "NVLink errors rising",
                                    99: "not a GPU of this host"})
    hs = state.hosts[0]
    assert hs.worn_gpus == 0b1010 and hs.usable_gpus == 0xFF
    assert state.worn_reasons == {"h-1": {1: "NVLink errors rising", 3: "thermal throttling"}}
    assert state.any_worn and scorer.applies(state)
    assert ([dict(b) for b in state.by_free], state.usable_total, state.epoch) == before
    assert hs.copy().worn_gpus == 0b1010
    empty = state.empty_like()
    assert not empty.any_worn and all(h.worn_gpus == 0 for h in empty.hosts)
    state.set_degraded_gpus("h-1", {})
    assert not state.any_worn and state.worn_reasons == {} and hs.worn_gpus == 0


def test_scorers_that_do_not_apply_are_left_out_of_the_trial():
    state = make_state({"name": "h-1", "model": "dgx-h100"})
    spec = gpus_job("j", 1)
    assert Trial(spec, compile_needs(spec), state, REG).scorers == []
    state.set_degraded_gpus("h-1", {0: "thermal throttling"})
    assert len(Trial(spec, compile_needs(spec), state, REG).scorers) == 1


def test_weight_grows_with_the_expected_runtime():
    s = HealthScorer()
    assert s.weight(gpus_job("a", 1, "30m")) == 0            # short: not steered
    assert s.weight(gpus_job("b", 1, "1h")) == 0
    assert 0 < s.weight(gpus_job("c", 1, "2h")) < s.weight(gpus_job("d", 1, "20h"))
    assert s.weight(gpus_job("e", 1, "3d")) == s.weight(gpus_job("f", 1)) == 24


# -- between hosts -----------------------------------------------------------------------

def two_hosts():
    """h-1: 2 free GPUs, both worn (the tightest fit); h-2: 4 free GPUs, none worn."""
    state = make_state({"name": "h-[1-2]", "model": "dgx-h100"})
    occupy(state, "h-1", [0, 1, 2, 3, 4, 5], "busy1")
    occupy(state, "h-2", [0, 1, 2, 3], "busy2")
    state.set_degraded_gpus("h-1", {6: "correctable ECC errors rising", 7: "thermal throttling"})
    return state


def test_a_long_job_lands_on_clean_gpus_a_short_one_takes_the_worn_ones():
    state = two_hosts()
    for spec in (gpus_job("long", 2, "10h"), gpus_job("unknown", 2)):
        (a,) = place(spec, state, REG).allocations
        assert a.host.name == "h-2", spec.name
        (p,) = place(spec, state, PLAIN).allocations     # without wear: the tightest host
        assert p.host.name == "h-1"
    (a,) = place(gpus_job("short", 2, "30m"), state, REG).allocations
    assert a.host.name == "h-1" and a.gpus == [6, 7]


def test_worn_gpus_are_never_excluded():
    state = two_hosts()
    occupy(state, "h-2", [4, 5, 6, 7], "busy3")          # the clean GPUs are all busy
    (a,) = admit(state, gpus_job("long", 2, "3d"))
    assert a.host.name == "h-1" and a.gpus == [6, 7]
    whole = make_state({"name": "w-1", "model": "dgx-a100"})
    whole.set_degraded_gpus("w-1", {g: "thermal throttling" for g in range(8)})
    (a,) = admit(whole, gpus_job("all", 8, "3d"))
    assert a.gpus == list(range(8))


def test_a_gang_spreads_onto_clean_hosts():
    state = make_state({"name": "h-[1-3]", "model": "dgx-h100"})
    state.set_degraded_gpus("h-1", {5: "NVLink errors rising"})
    allocs = admit(state, gpus_job("gang", 8, "2d", replicas=2))
    assert sorted(a.host.name for a in allocs) == ["h-2", "h-3"]
    plain = make_state({"name": "h-[1-3]", "model": "dgx-h100"})
    assert "h-1" in {a.host.name for a in admit(plain, gpus_job("gang", 8, "2d", replicas=2))}


# -- within a host -----------------------------------------------------------------------

def test_a_replica_avoids_worn_gpus_in_its_host():
    state = make_state({"name": "h-1", "model": "dgx-h100"})
    state.set_degraded_gpus("h-1", {0: "thermal throttling", 1: "thermal throttling"})
    (a,) = admit(state, gpus_job("one", 1))
    assert a.gpus[0] not in (0, 1)
    (b,) = admit(state, gpus_job("four", 4))
    assert not {0, 1} & set(b.gpus)
    (c,) = admit(state, gpus_job("three", 3))            # only worn ones are left over
    assert {0, 1} <= set(c.gpus)


def test_worn_gpus_inside_a_host_go_last_on_dgx1_within_the_best_nvlink_sets():
    state = make_state({"name": "d-1", "model": "dgx-1v"})
    state.set_degraded_gpus("d-1", {0: "NVLink errors rising"})
    (q,) = admit(state, gpus_job("quad", 4))
    assert q.gpus == [4, 5, 6, 7]                        # a clean fully connected quad
    (p,) = admit(state, gpus_job("pair", 2))
    t = p.host.type
    assert 0 not in p.gpus and t.links[p.gpus[0]][p.gpus[1]] == 2
    plain = make_state({"name": "d-1", "model": "dgx-1v"})
    (q,) = admit(plain, gpus_job("quad", 4))
    assert q.gpus == [0, 1, 2, 3]


def test_the_gpu_set_cache_keys_on_the_worn_gpus():
    state = make_state({"name": "h-1", "model": "dgx-h100"})
    t = state.cluster.hosts[0].type
    plain = ranked_gpu_sets(t, 0xFF, 1)
    worn = ranked_gpu_sets(t, 0xFF, 1, plain[0])
    assert worn[0] != plain[0] and sorted(worn) == sorted(plain) and worn[-1] == plain[0]
    assert ranked_gpu_sets(t, 0xFF, 1) == plain
    assert ranked_gpu_sets(t, 0xFF, 1, 1 << 8) == plain     # worn GPUs outside free: ignored


# -- random clusters and job streams ------------------------------------------------------

MODELS = ("dgx-1v", "dgx-2", "dgx-a100", "dgx-h100")


def random_stream(rng: random.Random, n: int):
    for i in range(n):
        gpus = rng.choice((0, 1, 1, 1, 2, 4, 8))
        replicas = rng.choice((1, 1, 1, 2, 3))
        roles = [{"name": "w", "gpus": gpus, "replicas": replicas, "cpus": rng.randint(1, 16),
                  "memory": f"{rng.randint(1, 64)}GiB"}]
        if rng.random() < 0.2:
            roles.append({"name": "ps", "gpus": 0, "cpus": 2, "memory": "4GiB"})
        placement = {"locality": rng.choice(("host", "switch", "any")),
                     "pack": rng.random() < 0.7}
        yield job(f"j{i}", *roles, placement=placement,
                  expected_runtime=rng.choice((None, "30m", "5h", "3d")))


def random_cluster(rng: random.Random, worn: bool):
    hosts = [{"name": f"h{i:02d}", "model": rng.choice(MODELS),
              "switch": f"leaf-{rng.randint(1, 3)}"} for i in range(rng.randint(2, 10))]
    state = make_state(*hosts)
    for h in state.cluster.hosts if worn else ():
        if rng.random() < 0.4:
            picked = rng.sample(range(h.type.n_gpus), rng.randint(1, 3))
            state.set_degraded_gpus(h.name, {g: "thermal throttling" for g in picked})
    return state


def test_without_worn_gpus_placements_are_those_of_a_registry_without_scorers():
    for seed in range(8):
        rng = random.Random(seed)
        state = random_cluster(rng, worn=False)
        if seed % 2:   # worn once, then healthy again
            state.set_degraded_gpus("h00", {0: "thermal throttling"})
            state.set_degraded_gpus("h00", {})
        running: list[str] = []
        for spec in random_stream(rng, 60):
            if running and rng.random() < 0.3:
                state.release(running.pop(rng.randrange(len(running))))
            got, want = place(spec, state, REG), place(spec, state, PLAIN)
            assert type(got) is type(want), (seed, spec.name)
            if isinstance(got, Placed):
                assert [(a.host.name, a.gpu_mask, a.cpu_masks, a.mem) for a in got.allocations] \
                    == [(a.host.name, a.gpu_mask, a.cpu_masks, a.mem) for a in want.allocations]
                state.commit(spec.name, got.allocations)
                running.append(spec.name)


def test_with_worn_gpus_a_job_starts_whenever_it_would_without_them():
    """Wear changes where a job goes, never whether it goes."""
    moved = 0
    for seed in range(10):
        rng = random.Random(seed)
        state = random_cluster(rng, worn=True)
        running: list[str] = []
        for spec in random_stream(rng, 60):
            if running and rng.random() < 0.3:
                state.release(running.pop(rng.randrange(len(running))))
            got, want = place(spec, state, REG), place(spec, state, PLAIN)
            assert type(got) is type(want), (seed, spec.name)
            if isinstance(got, Placed):
                moved += [a.gpu_mask for a in got.allocations] != \
                    [a.gpu_mask for a in want.allocations]
                state.commit(spec.name, got.allocations)
                running.append(spec.name)
    assert moved     # and wear did change some choices
