"""The REST API lives in api/ (api/app.py); `airflow-gpu server` names this path."""

from ..api.app import _log_to_stderr, app_from_env, create_app  # noqa: F401
