"""The `airflow-gpu` command, run as a user runs it (a real subprocess)."""

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

EXAMPLE_JOBS = REPO / "examples" / "jobs.yaml"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_gpu.cli", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def test_plan_json_contract():
    out = run("plan", "--cluster", "example", "--jobs", str(EXAMPLE_JOBS), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"admitted", "pending", "rejected", "refused"}
    assert data["refused"] == []
    admitted = {j["job"]: j for j in data["admitted"]}
    tf = admitted["imagenet-tf"]
    assert len(tf["replicas"]) == 12
    for r in tf["replicas"]:
        assert {"role", "index", "host", "gpus", "cpus", "numa_nodes", "memory_bytes",
                "nics"} <= set(r)
    assert [p["job"] for p in data["pending"]] == ["a100-sweep"]
    # when llm-pretrain (2d, on four hosts under one switch: slowdown 1.1) ends
    assert data["pending"][0]["eta_seconds"] == round(2 * 86400 * 1.1)
    assert data["pending"][0]["reason"]
    assert [r["job"] for r in data["rejected"]] == ["too-big-model"]
    # higher priority first: the brief's job is placed before anything else
    assert data["admitted"][0]["job"] == "imagenet-tf"


def test_plan_table():
    out = run("plan", "--jobs", str(EXAMPLE_JOBS))
    assert out.returncode == 0, out.stderr
    # the brief's >= 48 GiB workers take H100s and leave the H200s free
    for text in ("imagenet-tf", "dgx-h-01", "Pending", "a100-sweep", "Rejected",
                 "too-big-model", "mlx5_0"):
        assert text in out.stdout
    assert "dgx-h200-01" not in out.stdout


def test_models_command():
    out = run("models", "--json")
    assert [m["model"] for m in json.loads(out.stdout)] == [
        "dgx-1v", "dgx-2", "dgx-a100", "dgx-a100-80gb", "dgx-b200", "dgx-h100", "dgx-h200",
        "gb200-nvl72-tray"]


GOOD_CLUSTER = "hosts:\n  - {name: 'h-[1-2]', model: dgx-h100, rack: r1, switch: s1}\n"
GOOD_JOBS = "jobs:\n  - name: j\n    roles: [{name: w, gpus: 1}]\n"


@pytest.mark.parametrize("which,text,expected", [
    ("cluster", "hosts: [\n", "line 2"),                                     # malformed YAML
    ("cluster", "hosts:\n  - {name: h, model: dgx-b300}\n", "hosts[0].model"),
    ("cluster", "hosts:\n  - {name: h, model: dgx-h100, swtich: s}\n",
     "unknown field 'swtich'; did you mean 'switch'?"),
    ("cluster", "hosts:\n  - {name: 'h-[3-1]', model: dgx-h100}\n", "runs backwards"),
    ("cluster", "hosts:\n  - {name: h, model: dgx-h100}\n  - {name: h, model: dgx-a100}\n",
     "declared twice"),
    ("jobs", "jobs:\n  - name: j\n    roles: [{name: w, replicaz: 2}]\n",
     "jobs[0].roles[0]: unknown field 'replicaz'; did you mean 'replicas'?"),
    ("jobs", "jobs:\n  - name: j\n    roles: [{name: w, memory: -8GiB}]\n",
     "jobs[0].roles[0].memory: size '-8GiB' is negative; give 0 or more"),
    ("jobs", "jobs:\n  - name: j\n    job_class: jax\n    roles: [{name: w}]\n",
     "unknown class 'jax'; known classes: etl, pytorch"),
    ("jobs", "jobs:\n  - name: j\n    roles: [{name: w}]\n    placement: {locality: galaxy}\n",
     "jobs[0].placement.locality"),
    ("jobs", "jobs:\n  - name: j\n    expected_runtime: soon\n    roles: [{name: w}]\n",
     "jobs[0].expected_runtime"),
    ("jobs", "- just\n- a list\n", "expected a mapping with 'jobs: [...]'"),
])
def test_bad_input_gives_one_clear_message_and_exit_2(tmp_path, which, text, expected):
    cluster, jobs = tmp_path / "cluster.yaml", tmp_path / "jobs.yaml"
    cluster.write_text(text if which == "cluster" else GOOD_CLUSTER)
    jobs.write_text(text if which == "jobs" else GOOD_JOBS)
    out = run("plan", "--cluster", str(cluster), "--jobs", str(jobs))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert str(tmp_path / f"{which}.yaml") in out.stderr       # names the file
    assert expected in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_missing_file():
    out = run("plan", "--cluster", "nope.yaml", "--jobs", str(EXAMPLE_JOBS))
    assert out.returncode == 2 and "nope.yaml: file not found" in out.stderr
