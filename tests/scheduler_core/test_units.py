import pytest

from airflow_gpu.scheduler_core.units import (
    exact_size,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize("text,expected", [
    ("8GiB", 8 * 2**30), ("48GB", 48 * 10**9), ("512MiB", 512 * 2**20), ("1.5TiB", 3 * 2**39),
    ("1024B", 1024), ("100b", 100), ("2 gi", 2 * 2**30), (0, 0), ("0", 0),
    # K, M, G, T are binary, as in Slurm (--mem=8G is 8GiB); KB, MB, GB, TB decimal
    ("8G", 8 * 2**30), ("8g", 8 * 2**30), ("512M", 512 * 2**20), ("2T", 2 * 2**40),
    ("4K", 4096), ("8gb", 8 * 10**9),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1GiB", -5, "8 parsecs", "GiB", "", True])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("bare", [48, "48", 1.5, 2**40, " 7 "])
def test_a_size_needs_a_unit(bare):
    """`memory: 48` is not 48 bytes: a number without a unit is refused, naming the units."""
    with pytest.raises(ValueError, match=r"has no unit; write e\.g\. .*GiB.*B for bytes"):
        parse_size(bare)


@pytest.mark.parametrize("text,expected", [
    ("90m", 5400), ("6h", 21600), ("2d", 172800), ("1h30m", 5400), ("45s", 45), (600, 600),
    ("1w", 604800),
])
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["-1h", "6 hours", "h", "", "1y"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_round_trip_formatting():
    assert format_size(8 * 2**30) == "8GiB"
    assert parse_size(format_size(5 * 2**30)) == 5 * 2**30
    assert format_duration(5400) == "1h30m"
    assert parse_duration(format_duration(93784)) == 93784


@pytest.mark.parametrize("text,stored", [
    ("48GB", "48GB"), ("8G", "8GiB"), ("1.5GiB", "1536MiB"), ("44.7GiB", "47996259532B"),
    ("3KB", "3KB"), ("4096B", "4KiB"), ("0", "0B")])
def test_a_spec_stores_sizes_exactly(text, stored):
    """What a saved spec says reads back to the same bytes (48GB is not 44.7GiB)."""
    assert exact_size(parse_size(text)) == stored
    assert parse_size(stored) == parse_size(text)


def test_a_saved_spec_keeps_its_memory_sizes():
    from airflow_gpu.scheduler_core.jobspec import JobSpec

    spec = JobSpec.model_validate({"name": "j", "roles": [
        {"name": "w", "gpus": 1, "memory": "48GB", "gpu": {"min_memory": "40GB"}}]})
    again = JobSpec.model_validate(spec.model_dump(mode="json"))
    assert again.roles[0].memory == 48 * 10**9
    assert again.roles[0].gpu.min_memory == 40 * 10**9
