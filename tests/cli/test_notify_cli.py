"""The notification commands against a real server process and a real receiver:
`team-set --webhook ... --webhook-secret new` prints the secret once, `teams` shows the
webhook and the secret's hint, a job file's `notify`, `explain` with the delivery state,
`notifications` listing what was given up (admins), and the refusals (exit codes)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.clirun import cli
from tests.helpers import until
from tests.servers import Server
from tests.webhooks import Receiver

CLUSTER = {"cluster": "n", "hosts": [
    {"name": "dgx-1", "model": "dgx-a100", "rack": "r1", "switch": "s1"}]}


@pytest.fixture
def env(db_url, tmp_path):
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump({"notifications": {
        "allowed_urls": ["http://127.0.0.1:"], "retry_first": 1}}))
    srv = Server(db_url, tmp_path / "cluster.yaml", log=tmp_path / "server.log",
                 args=("--policy-file", str(tmp_path / "policy.yaml")))
    token = cli("token", "create", "--team", "vision", "--db", db_url).stdout.strip()
    admin = cli("token", "create", "--team", "ops", "--admin", "--db", db_url).stdout.strip()
    yield {"AIRFLOW_GPU_URL": srv.url, "AIRFLOW_GPU_TOKEN": token, "ADMIN": admin}
    srv.stop()


def test_team_webhook_job_notify_explain_and_the_admins_list(env, tmp_path):
    as_admin = {**env, "AIRFLOW_GPU_TOKEN": env["ADMIN"]}
    hook, refusing = Receiver().start(), Receiver((404,)).start()
    try:
        out = cli("team-set", "vision", "--webhook", hook.url, "--webhook-events",
                  "start,end", "--webhook-secret", "new", env=as_admin)
        assert out.returncode == 0, out.stderr
        secret = out.stdout.strip()
        assert secret.startswith("whsec_") and "\n" not in secret
        teams = cli("teams", env=env).stdout
        assert f"{hook.url} (start, end)" in teams and f"whsec_...{secret[-4:]}" in teams
        assert secret not in teams

        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump({"name": "train", "roles": [{"name": "w", "gpus": 1}],
                                       "notify": {"url": refusing.url}}))
        job_id = cli("submit", str(job), env=env).stdout.strip()
        assert cli("cancel", job_id, env=env).returncode == 0
        hook.wait(1)                           # the team's: admitted (start) or cancelled
        refusing.wait(1)                       # the job's own: cancelled (end), refused
        shown = until(lambda: (e := json.loads(cli("explain", job_id, "--json",
                                                   env=env).stdout))["notifications"]
                      and {n["state"] for n in e["notifications"]} >= {"given_up"} and e,
                      "the job's notification given up")
        table = cli("explain", job_id, env=env).stdout
        assert "Notifications" in table and "given up after 1 attempt(s)" in table
        assert "HTTP 404 Not Found" in table
        out = cli("notifications", env=env)
        assert out.returncode == 1 and "only admins" in out.stderr
        listed = json.loads(cli("notifications", "--json", env=as_admin).stdout)
        given_up = [n for n in shown["notifications"] if n["state"] == "given_up"]
        assert [n["delivery_id"] for n in listed] == [n["delivery_id"] for n in given_up]
        assert "given up" in cli("notifications", env=as_admin).stdout

        out = cli("team-set", "vision", "--webhook", "https://elsewhere.example/x",
                  env=as_admin)
        assert out.returncode == 2 and "notifications.allowed_urls" in out.stderr
        out = cli("team-set", "vision", "--webhook", "none", env=as_admin)
        assert out.returncode == 0 and hook.url not in out.stdout
    finally:
        hook.stop()
        refusing.stop()
