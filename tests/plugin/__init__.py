"""The UI plugin against a real Airflow API server (a package: its fixtures end with it)."""
