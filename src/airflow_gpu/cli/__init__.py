"""The `airflow-gpu` command: main.py runs it, cli_config.py declares its command groups
(commands/<group>_command.py), common.py holds what the groups share."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
