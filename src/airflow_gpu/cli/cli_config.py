"""The commands of `airflow-gpu`, group by group, in the order `airflow-gpu --help` lists
them. Each group declares its commands and flags in commands/<group>_command.py
(`add_commands`) and implements them there; the client commands share one parent parser
(common.client_parent: --url, --token, --conn-id, --json)."""

from __future__ import annotations

import argparse

from ..agent import cli as agent_cli
from .commands import (
    acct_command,
    cancel_command,
    db_command,
    demo_command,
    jobs_command,
    plan_command,
    reserve_command,
    run_command,
    server_command,
    slurm_command,
    token_command,
)
from .common import client_parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-gpu", description="GPU-aware workload management for Airflow on DGX.")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"airflow-gpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    client = client_parent()
    plan_command.add_commands(sub)              # plan, simulate, models
    server_command.add_commands(sub)            # server
    db_command.add_commands(sub)                # db upgrade | check | repair
    acct_command.add_commands(sub, client)      # acct
    token_command.add_commands(sub, client)     # token list | create | revoke
    # submit, status, explain, slowdown, teams, team-set
    jobs_command.add_commands(sub, client)
    cancel_command.add_commands(sub, client)    # cancel (scancel, filters too)
    # Slurm's and Grid Engine's habits: queue, prio, share, hold, release, requeue,
    # update, drain, resume, cluster
    slurm_command.add_commands(sub, client)
    reserve_command.add_commands(sub, client)   # reserve create | list | show | ...
    agent_cli.add_commands(sub)                 # agent, topo, ... (agent/cli.py)
    run_command.add_commands(sub)               # run (srun)
    demo_command.add_commands(sub)              # demo
    return parser
