"""Airflow, where a test imports it in this process, gets a throw-away home; the
database fixtures every folder shares."""

import os
import tempfile

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-gpu-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

# The database fixtures (`db_url`: SQLite and PostgreSQL; `api`: the real app on it) for
# every folder: the API, service, store and CLI tests share them.
from tests.databases import api, db_url  # noqa: E402, F401
