"""Airflow, where a test imports it in this process, gets a throw-away home; property
tests draw fixed examples; the database fixtures every folder shares; how pytest-xdist
deals the tests out."""

import os
import tempfile

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-gpu-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

# Property tests (hypothesis) draw the same examples on every run and machine (a seed per
# test from its code, no example database): a guarantee's test passes or fails in CI as
# it did before, not on a lucky draw. HYPOTHESIS_PROFILE=explore draws new ones, to
# search; add what it finds as an @example.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The database fixtures (`db_url`: SQLite and PostgreSQL; `api`: the real app on it) for
# every folder: the API, service, store and CLI tests share them.
from tests.databases import api, db_url, empty_db_url, templates  # noqa: E402, F401


def pytest_xdist_make_scheduler(config, log):
    """Each test goes to the worker that is free, except what one worker runs whole: a
    docs page (its blocks share one shell: a server one block starts serves the next),
    tests/plugin (one Airflow stack and browser for the folder) and tests/e2e (one Airflow
    home and dag.test() fork server, ~14 CPU-s to set up, in one worker instead of each;
    its tests mostly wait, while the others use the cores). Scopes with the most tests go
    first, so the long ones do not start last."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.endswith(".md"):
                return path
            for folder in ("tests/plugin/", "tests/e2e/"):
                if path.startswith(folder):
                    return folder
            return nodeid

    return Scheduling(config, log)
