"""Airflow, where a test imports it in this process, gets a throw-away home."""

import os
import tempfile

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-gpu-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
