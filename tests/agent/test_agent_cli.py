"""`airflow-gpu agent` from the command line against a real service: declared mode with
flags or a config file, clear errors for a refused token and an unknown model; the
`cluster` table shows agents' hosts, utilization and unreachable hosts."""

from __future__ import annotations

import yaml

from airflow_gpu.cli import main
from tests.agent.test_agent_service import Stack


def test_declared_agent_with_flags_and_with_a_config_file(db_url, tmp_path, capsys):
    s = Stack(db_url, tmp_path)
    try:
        url, token = s.server.url, s.admin_token
        assert main(["agent", "--server", url, "--token", token, "--declared", "dgx-h200",
                     "--name", "sim-01", "--rack", "r9", "--switch", "s9", "--once"]) == 0
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump({"server": url, "token": token, "name": "sim-02",
                                          "rack": "r9", "switch": "s9", "declared": "dgx-2",
                                          "labels": {"pool": "sim"}}))
        assert main(["agent", "--config", str(config), "--once"]) == 0
        hosts = {h["name"]: h for h in s.admin.cluster()["hosts"]}
        assert (hosts["sim-01"]["model"], len(hosts["sim-01"]["gpus"]),
                hosts["sim-01"]["rack"]) == ("dgx-h200", 8, "r9")
        assert (hosts["sim-02"]["model"], len(hosts["sim-02"]["gpus"])) == ("dgx-2", 16)
        assert all(g["healthy"] for g in hosts["sim-02"]["gpus"])
        capsys.readouterr()
        assert main(["cluster", "--url", url, "--token", token]) == 0
        table = capsys.readouterr().out
        assert "sim-01" in table and "util % (per GPU)" in table
    finally:
        s.close()


def test_agent_errors_name_the_fix(db_url, tmp_path, capsys):
    s = Stack(db_url, tmp_path)
    try:
        url = s.server.url
        assert main(["agent", "--server", url, "--token", s.team_token, "--declared",
                     "dgx-a100", "--name", "n1", "--once"]) == 2
        err = capsys.readouterr().err
        assert "403" in err and "use an admin token" in err
        assert main(["agent", "--server", url, "--token", s.admin_token, "--declared",
                     "dgx-z9", "--name", "n1", "--once"]) == 2
        err = capsys.readouterr().err
        assert "--declared: unknown host model 'dgx-z9'" in err and "dgx-a100" in err
        bad = tmp_path / "bad.yaml"
        bad.write_text("intervall: 5\n")
        assert main(["agent", "--config", str(bad), "--once"]) == 2
        assert "did you mean 'interval'" in capsys.readouterr().err
    finally:
        s.close()
