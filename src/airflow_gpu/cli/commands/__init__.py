"""One module per command group of `airflow-gpu` (registered by cli_config.py)."""
