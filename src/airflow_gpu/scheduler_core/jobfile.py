"""Job specs as clients read them, one way for all: `plan`, `submit` and `run` read job
files with read_jobs, and they and the Airflow operators turn what they will send into
the service's JSON with job_request. A value one of them accepts is then a value every
one accepts, in the same words when it is refused (errors.py, fielderrors.py), and what
is sent is what the service stores: JSON values, only the fields given. Both check specs
as new ones (newspecs.py: a deadline ahead, downstream with a deadline), as the API does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import InputError, load_yaml, validate
from .jobspec import JobsFile, JobSpec
from .newspecs import submitting


def read_jobs(path: str | Path) -> list[JobSpec]:
    """Job specs from a YAML/JSON file holding `jobs: [...]` (or a single job)."""
    data = load_yaml(path)
    if isinstance(data, dict) and "jobs" not in data and "roles" in data:
        data = {"jobs": [data]}
    if not isinstance(data, dict):
        raise InputError("expected a mapping with 'jobs: [...]' (a list of job specs)",
                         str(path))
    with submitting():
        return validate(JobsFile, data, str(path)).jobs


def wire(spec: JobSpec) -> dict[str, Any]:
    """The spec as the service gets it: JSON values (a deadline as ISO 8601 text, sizes
    and durations as units) and only the fields given, so the service fills the rest from
    the job class and the policy as for any submit."""
    return spec.model_dump(mode="json", exclude_unset=True)


def job_request(data: Any, source: str) -> dict[str, Any]:
    """`data` checked as a job spec (InputError naming `source` and the field), as sent."""
    with submitting():
        return wire(validate(JobSpec, data, source))


def file_index(i: int, name: str) -> str:
    """A job of a file or a batch, as refusals name it: jobs[1] (name 'train')."""
    return f"jobs[{i}] (name {name!r})"
