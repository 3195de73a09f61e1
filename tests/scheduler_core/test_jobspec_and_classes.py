import pytest

from airflow_gpu.scheduler_core.engine.placement import Placed, Unplaced, place
from airflow_gpu.scheduler_core.errors import InputError
from airflow_gpu.scheduler_core.jobclasses import Defaults, JobClass, resolve, stop_grace
from airflow_gpu.scheduler_core.jobspec import JobSpec
from airflow_gpu.scheduler_core.plugins import default_registry, hookimpl, make_registry
from tests.helpers import job, make_state

REG = default_registry()


def test_spec_defaults_and_units():
    spec = JobSpec.model_validate({
        "name": "j", "expected_runtime": "90m",
        "roles": [{"name": "w", "gpus": 2, "memory": "48GB", "gpu": {"model": "A100",
                                                                    "min_memory": "40GiB"}}]})
    assert spec.expected_runtime == 5400
    assert spec.roles[0].memory == 48 * 10**9
    assert spec.roles[0].gpu.model == ["A100"] and spec.roles[0].gpu.min_memory == 40 * 2**30
    assert spec.placement.locality == "any" and spec.placement.pack
    assert spec.total_gpus == 2


@pytest.mark.parametrize("field,value", [
    ("replicas", 0), ("gpus", -1), ("cpus", 0), ("memory", "-1GiB"), ("memory", "lots"),
])
def test_bad_role_values(field, value):
    with pytest.raises(ValueError):
        JobSpec.model_validate({"name": "j", "roles": [{"name": "w", field: value}]})


def test_duplicate_role_names():
    with pytest.raises(ValueError, match="unique"):
        JobSpec.model_validate({"name": "j", "roles": [{"name": "w"}, {"name": "w"}]})


def test_builtin_classes_are_plugins_with_the_four_names():
    assert {"pytorch", "tensorflow-ps", "etl", "validation"} <= set(REG.job_classes)


def test_class_fills_only_unset_fields():
    spec = job("tf", {"name": "ps", "replicas": 2}, {"name": "worker", "gpus": 1},
               job_class="tensorflow-ps", placement={"locality": "rack"})
    out = resolve(spec, REG.job_classes)
    ps = out.roles[0]
    assert ps.cpus == 1 and ps.memory == 8 * 2**30          # class defaults for ps
    assert out.placement.locality == "rack"                  # the user's value wins
    assert out.placement.affinity == "strict"                # class default
    assert out.expected_runtime == 6 * 3600


def test_pytorch_class_is_strict_and_packed():
    out = resolve(job("p", {"name": "w", "gpus": 1}, job_class="pytorch"), REG.job_classes)
    assert out.placement.affinity == "strict" and out.placement.pack and out.placement.nics


def test_unknown_class_lists_the_known_ones():
    with pytest.raises(InputError, match="known classes: etl, pytorch, tensorflow-ps"):
        resolve(job("x", {"name": "w"}, job_class="jax"), REG.job_classes)


def test_etl_is_cpu_only_and_validation_is_small():
    with pytest.raises(InputError, match="CPU-only"):
        resolve(job("e", {"name": "w", "gpus": 1}, job_class="etl"), REG.job_classes)
    with pytest.raises(InputError, match="at most 8 GPUs"):
        resolve(job("v", {"name": "w", "replicas": 2, "gpus": 8}, job_class="validation"),
                REG.job_classes)


class _LabelPlugin:
    """A third-party plugin: a job class, a filter on host labels and a scorer."""

    @hookimpl
    def airflow_gpu_job_classes(self):
        return [JobClass("inference", "latency-critical serving",
                         placement={"affinity": "strict"}, priority_weight=100)]

    @hookimpl
    def airflow_gpu_host_filters(self):
        def only_zone_b(job, role, host):
            return None if host.labels.get("zone") == "b" else "not in zone b"
        return [only_zone_b]

    @hookimpl
    def airflow_gpu_host_scorers(self):
        return [lambda job, role, host, hs: 1.0 if host.name.endswith("3") else 0.0]


def test_plugins_add_classes_filters_and_scorers():
    reg = make_registry(extra_plugins=(_LabelPlugin(),))
    assert "inference" in reg.job_classes and "pytorch" in reg.job_classes
    state = make_state({"name": "h-[1-2]", "model": "dgx-h100", "labels": {"zone": "a"}},
                       {"name": "h-[3-4]", "model": "dgx-h100", "labels": {"zone": "b"}})
    spec = resolve(job("s", {"name": "w", "gpus": 1}, job_class="inference"), reg.job_classes)
    got = place(spec, state, reg)
    assert isinstance(got, Placed) and got.allocations[0].host.name == "h-3"
    big = job("b", {"name": "w", "replicas": 3, "gpus": 8})
    assert isinstance(place(big, state, reg), Unplaced)      # only two hosts in zone b
    assert isinstance(place(big, state, REG), Placed)        # without the plugin: four


GiB = 2**30


def test_every_replica_books_memory():
    """No spec books nothing: a role without memory books the class's or the policy's per
    GPU and per CPU, and an explicit 0 is refused (it would be an unlimited cgroup)."""
    spec = job("j", {"name": "w", "gpus": 2, "cpus": 8}, {"name": "ps", "cpus": 2})
    got = resolve(spec, REG.job_classes)
    assert [r.memory for r in got.roles] == [2 * 16 * GiB + 8 * GiB, 2 * GiB]
    got = resolve(spec, REG.job_classes, defaults=Defaults(40 * GiB, 3 * GiB))   # the policy's
    assert [r.memory for r in got.roles] == [2 * 40 * GiB + 24 * GiB, 6 * GiB]
    tf = job("tf", {"name": "worker", "gpus": 1, "cpus": 4}, {"name": "ps"},
             job_class="tensorflow-ps")
    assert [r.memory for r in resolve(tf, REG.job_classes).roles] == [20 * GiB, 8 * GiB]
    heavy = JobClass("heavy", "host memory per GPU", memory_per_gpu=100 * GiB)
    reg = make_registry(extra_plugins=(_classes_plugin(heavy),))
    got = resolve(job("h", {"name": "w", "gpus": 1, "cpus": 2}, job_class="heavy"),
                  reg.job_classes, defaults=Defaults(40 * GiB, 3 * GiB))
    assert got.roles[0].memory == 100 * GiB + 6 * GiB     # the class's per GPU wins
    placed = place(got, make_state({"name": "h1", "model": "dgx-a100"}), reg)
    assert isinstance(placed, Placed) and placed.allocations[0].memory_bytes == 106 * GiB
    with pytest.raises(ValueError, match="must book some host memory"):
        job("z", {"name": "w", "gpus": 1, "memory": 0})


def test_time_limits_come_from_the_job_its_class_or_the_policy_within_their_maximum():
    gpu = {"name": "w", "gpus": 1}
    # none anywhere: no limit; the policy's default; the class's default wins over it
    assert resolve(job("a", gpu), REG.job_classes).time_limit is None
    policy = Defaults(time_limit=7 * 86400, max_time_limit=14 * 86400, stop_grace=60)
    assert resolve(job("a", gpu), REG.job_classes, defaults=policy).time_limit == 7 * 86400
    v = resolve(job("v", gpu, job_class="validation"), REG.job_classes, defaults=policy)
    assert v.time_limit == 2 * 3600 and v.expected_runtime == 1800
    # the job's own, up to the class's maximum (1d) and the policy's (14d)
    mine = job("v", gpu, job_class="validation", time_limit="20h")
    assert resolve(mine, REG.job_classes, defaults=policy).time_limit == 20 * 3600
    with pytest.raises(InputError, match=r"time_limit: 2d is more than job class "
                       r"'validation' allows \(1d\); ask for at most 1d"):
        resolve(job("v", gpu, job_class="validation", time_limit="2d"), REG.job_classes)
    with pytest.raises(InputError, match="more than the queue policy allows"):
        resolve(job("a", gpu, time_limit="15d"), REG.job_classes, defaults=policy)
    # no limit asked where only a maximum is set: the maximum (Slurm's MaxTime)
    capped = Defaults(max_time_limit=3 * 86400)
    assert resolve(job("a", gpu), REG.job_classes, defaults=capped).time_limit == 3 * 86400
    # a class's default estimate longer than the job's limit is planned as the limit
    short = resolve(job("p", gpu, job_class="pytorch", time_limit="1h"), REG.job_classes)
    assert (short.time_limit, short.expected_runtime) == (3600, 3600)
    with pytest.raises(ValueError, match="expected_runtime: 2h is longer than time_limit 1h"):
        job("e", gpu, expected_runtime="2h", time_limit="1h")
    assert stop_grace(v, REG.job_classes, policy) == 60


def test_cores_are_whole_unless_the_job_its_class_or_the_policy_says_threads():
    gpu = {"name": "w", "gpus": 1, "cpus": 3}
    assert resolve(job("a", gpu), REG.job_classes).placement.cpu_allocation == "core"
    threads = Defaults(cpu_allocation="thread")
    assert resolve(job("a", gpu), REG.job_classes,
                   defaults=threads).placement.cpu_allocation == "thread"
    mine = job("a", gpu, placement={"cpu_allocation": "core"})
    assert resolve(mine, REG.job_classes, defaults=threads).placement.cpu_allocation == "core"
    hpc = JobClass("hpc", "thread-level", placement={"cpu_allocation": "thread"})
    reg = make_registry(extra_plugins=(_classes_plugin(hpc),))
    assert resolve(job("h", gpu, job_class="hpc"),
                   reg.job_classes).placement.cpu_allocation == "thread"


def _classes_plugin(*classes):
    class Plugin:
        @hookimpl
        def airflow_gpu_job_classes(self):
            return list(classes)
    return Plugin()
