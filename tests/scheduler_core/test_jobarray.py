"""A job spec's array ranges and dependency strings, as Slurm writes them, and the cycle
check of a job file: pure parsing, exact messages."""

from __future__ import annotations

import pytest

from airflow_gpu.scheduler_core.errors import InputError, validate
from airflow_gpu.scheduler_core.jobarray import format_indexes, parse_indexes
from airflow_gpu.scheduler_core.jobdeps import cycle, parse_dependency
from airflow_gpu.scheduler_core.jobspec import JobsFile, JobSpec


@pytest.mark.parametrize("text, indexes", [
    ("0-3", [0, 1, 2, 3]), ("1-7:2", [1, 3, 5, 7]), ("0,4,9-12", [0, 4, 9, 10, 11, 12]),
    ("7", [7]), ("3-5,4-6", [3, 4, 5, 6]), (" 2 , 0 ", [0, 2])])
def test_ranges_read_as_slurm_reads_them(text, indexes):
    assert parse_indexes(text) == indexes


@pytest.mark.parametrize("indexes, limit, text", [
    ([5, 6, 7, 8], 8, "5-8%8"), ([1, 3, 5, 7], None, "1-7:2"), ([0, 4, 9, 10, 11, 12], None,
                                                               "0,4,9-12"),
    ([0, 2], None, "0,2"), ([3], None, "3")])
def test_indexes_are_written_compactly_as_squeue_does(indexes, limit, text):
    assert format_indexes(indexes, limit) == text
    assert parse_indexes(text.split("%")[0]) == indexes


def test_the_forms_of_an_array_mean_the_same():
    one = JobSpec.model_validate({"name": "a", "roles": [{"name": "w"}], "array": "0-99%8"})
    two = JobSpec.model_validate({"name": "a", "roles": [{"name": "w"}],
                                  "array": {"range": "0-99", "max_running": 8}})
    assert one.model_dump() == two.model_dump()
    assert (len(one.array.indexes), one.array.max_running) == (100, 8)
    with pytest.raises(ValueError, match="says %8 and max_running says 4"):
        JobSpec.model_validate({"name": "a", "roles": [{"name": "w"}],
                                "array": {"range": "0-9%8", "max_running": 4}})


def test_a_huge_range_is_counted_not_expanded():
    with pytest.raises(ValueError, match="makes 1000000001 elements"):
        parse_indexes("0-1000000000")
    with pytest.raises(ValueError, match="index 1000000001 is over the largest"):
        parse_indexes("1000000001")


def test_dependency_strings():
    assert parse_dependency("afterok:a:b,afterany:c") == [
        {"kind": "afterok", "jobs": ["a", "b"]}, {"kind": "afterany", "jobs": ["c"]}]
    spec = JobSpec.model_validate({"name": "x", "roles": [{"name": "w"}], "depends_on": [
        {"afterok": "a:b"}, "afternotok:c", {"kind": "afterany", "jobs": ["d"]}]})
    assert [(d.kind, d.jobs) for d in spec.depends_on] == [
        ("afterok", ["a", "b"]), ("afternotok", ["c"]), ("afterany", ["d"])]
    with pytest.raises(ValueError, match="101 jobs named, over the most"):
        JobSpec.model_validate({"name": "x", "roles": [{"name": "w"}],
                                "depends_on": "afterok:" + ":".join(f"j{i}" for i in range(101))})


def test_a_cycle_is_found_and_a_chain_is_not():
    assert cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert cycle({str(i): [str(i + 1)] for i in range(5000)}) is None   # no recursion limit
    assert cycle({"a": ["b"], "b": [], "c": ["b", "a"]}) is None


def test_a_file_whose_jobs_wait_for_each_other_is_refused():
    jobs = [{"name": "a", "roles": [{"name": "w"}], "depends_on": "afterok:b_2"},
            {"name": "b", "roles": [{"name": "w"}], "array": "0-3", "depends_on": "afterok:a"}]
    with pytest.raises(InputError, match=r"jobs\[0\].depends_on: the jobs a, b wait for each "
                       r"other \(a -> b -> a\)"):
        validate(JobsFile, {"jobs": jobs}, "f.yaml")
    # its own name names an earlier job of that name: no cycle
    validate(JobsFile, {"jobs": [{"name": "a", "roles": [{"name": "w"}],
                                  "depends_on": "afterany:a"}]}, "f.yaml")
