"""Bad input to the service's commands and API (issue 17: "errors: one line, always"):
databases that cannot be reached or do not exist, mistyped SQLite URLs, team names job
specs would refuse; and through POST /api/v1/jobs a 422 naming the field for sizes
without a unit, yes/no counts and GPU constraints on roles without GPUs (never a 500)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scheduler_core.test_input_errors import cli, one_line_error

UNREACHABLE = "postgresql+psycopg://postgres:s3cret@127.0.0.1:1/test"


def sqlite(path: Path) -> str:
    return f"sqlite:///{path}"


# -- databases ---------------------------------------------------------------------------
COMMANDS = {
    "server": ("server", "--cluster", "example", "--port", "1"),
    "token create": ("token", "create", "--team", "vision"),
    "token revoke": ("token", "revoke", "--team", "vision"),
    "db upgrade": ("db", "upgrade"),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_postgresql_server_nobody_listens_on(command):
    err = one_line_error(cli(*COMMANDS[command], "--db", UNREACHABLE),
                         "error: --db: cannot use the database "
                         "'postgresql+psycopg://postgres:***@127.0.0.1:1/test': ",
                         "check that the database server runs and the URL's host, port, "
                         "user, password and database name")
    assert "s3cret" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_sqlite_file_in_a_folder_that_does_not_exist(tmp_path, command):
    url = sqlite(tmp_path / "nowhere" / "gpu.db")
    create = () if command == "db upgrade" else ("--create",)
    one_line_error(cli(*COMMANDS[command], "--db", url, *create),
                   f"--db: the folder of the SQLite file, '{tmp_path / 'nowhere'}', does not "
                   f"exist; create it (mkdir -p {tmp_path / 'nowhere'}) or fix the path")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("command", ["server", "token create", "token revoke"])
def test_a_sqlite_file_that_does_not_exist_is_not_created_unasked(tmp_path, command):
    """A mistyped path would start a new, empty database: refused, naming the fixes."""
    path = tmp_path / "airflow-gpu.bd"
    one_line_error(cli(*COMMANDS[command], "--db", sqlite(path)),
                   f"--db: the SQLite file '{path}' does not exist; create the database with "
                   f"`airflow-gpu db upgrade --db {sqlite(path)}` first, or pass --create")
    assert not path.exists()


@pytest.mark.parametrize("command", [("db", "check"), ("db", "repair"), ("token", "list")])
def test_commands_without_create_do_not_suggest_it(tmp_path, command):
    path = tmp_path / "airflow-gpu.bd"
    err = one_line_error(cli(*command, "--db", sqlite(path)),
                         f"--db: the SQLite file '{path}' does not exist; create the database "
                         f"with `airflow-gpu db upgrade --db {sqlite(path)}` first")
    assert "--create" not in err and not path.exists()


def test_db_upgrade_and_create_make_the_file(tmp_path):
    made = tmp_path / "made.db"
    out = cli("db", "upgrade", "--db", sqlite(made))
    assert out.returncode == 0 and made.exists(), out.stderr
    out = cli("token", "create", "--team", "vision", "--db", sqlite(made))
    assert out.returncode == 0 and out.stdout.startswith("agpu_"), out.stderr
    fresh = tmp_path / "fresh.db"
    out = cli("token", "create", "--team", "vision", "--db", sqlite(fresh), "--create")
    assert out.returncode == 0 and fresh.exists(), out.stderr
    out = cli("token", "revoke", "--team", "vision", "--db", sqlite(fresh))
    assert out.returncode == 0 and "revoked 1 token" in out.stdout, out.stderr


@pytest.mark.parametrize("url,says", [
    ("sqlite://airflow-gpu.db", "--db: 'sqlite://airflow-gpu.db' names no database file "
     "('airflow-gpu.db' is read as a host: SQLite URLs have three slashes, "
     "sqlite:///airflow-gpu.db); an in-memory database is gone when the command ends"),
    ("sqlite://", "--db: 'sqlite://' names no database file; an in-memory database"),
    ("sqlite:///:memory:", "names no database file"),
    ("mysql://u@h/db", "--db: 'mysql://u@h/db' is not a SQLite or PostgreSQL URL; use "
     "sqlite:///path/to/file.db or postgresql+psycopg://user@host/db"),
    ("postgresql+nosuch://u@h/db", "unknown database driver"),
    ("postgresql+psycopg://u@h:port/db", "is not a database URL"),
])
@pytest.mark.parametrize("command", COMMANDS)
def test_urls_that_name_no_database(command, url, says):
    one_line_error(cli(*COMMANDS[command], "--db", url), says)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_that_is_not_a_database(tmp_path, command):
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster: c\nhosts: []\n" * 100)
    one_line_error(cli(*COMMANDS[command], "--db", sqlite(path)),
                   f"--db: cannot use the database '{sqlite(path)}': file is not a database; ")
    assert path.read_text().startswith("cluster: c")


# -- team names --------------------------------------------------------------------------
@pytest.mark.parametrize("team", ["a b", "-x", "vision/ops", "équipe", "x" * 201, "", "a\n"])
def test_token_create_refuses_team_names_job_specs_would(tmp_path, team):
    db = sqlite(tmp_path / "gpu.db")
    assert cli("db", "upgrade", "--db", db).returncode == 0
    if team == "":
        one_line_error(cli("token", "create", f"--team={team}", "--db", db),
                       "--team: a team or admin token needs a team")
        return
    one_line_error(cli("token", "create", f"--team={team}", "--db", db),
                   "is not a team name; use letters, digits, '_', '.' and '-', starting with "
                   "a letter or digit, at most 200 characters")
    one_line_error(cli("token", "revoke", f"--team={team}", "--db", db), "is not a team name")


# -- through the API: 422 naming the field, on SQLite and PostgreSQL ---------------------
def auth(api, who: str) -> dict:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


@pytest.mark.parametrize("spec,loc,says", [
    ({"roles": [{"name": "w", "gpus": 1, "memory": 48}]}, ["roles", 0, "memory"],
     "size 48 has no unit"),
    ({"roles": [{"name": "w", "gpus": 1, "memory": "48"}]}, ["roles", 0, "memory"],
     "size '48' has no unit"),
    ({"roles": [{"name": "w", "gpus": 1, "gpu": {"min_memory": 40}}]},
     ["roles", 0, "gpu", "min_memory"], "size 40 has no unit"),
    ({"roles": [{"name": "w", "gpus": True}]}, ["roles", 0, "gpus"],
     "true is a yes/no value, not a number"),
    ({"roles": [{"name": "w", "replicas": True}]}, ["roles", 0, "replicas"],
     "true is a yes/no value"),
    ({"priority": False, "roles": [{"name": "w"}]}, ["priority"], "false is a yes/no value"),
    ({"roles": [{"name": "w", "gpu": {"model": "H100"}}]}, ["roles", 0],
     "gpu: the role sets GPU constraints (model) but asks for no GPUs (gpus: 0)"),
], ids=["memory-int", "memory-str", "min_memory", "gpus-bool", "replicas-bool",
        "priority-bool", "gpu-without-gpus"])
def test_the_api_answers_422_naming_the_field(api, spec, loc, says):
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"),
                 json={"spec": {"name": "j", **spec}})
    assert r.status_code == 422, r.text
    assert ["body", "spec", *loc] in [d["loc"] for d in r.json()["detail"]], r.text
    assert says in r.text, r.text


def test_the_api_reads_g_as_gib(api):
    r = api.post("/api/v1/jobs", headers=auth(api, "vision"), json={"spec": {
        "name": "j", "roles": [{"name": "w", "gpus": 1, "memory": "8G",
                                "gpu": {"min_memory": "16G"}}]}})
    assert r.status_code in (200, 201), r.text
    role = r.json()["spec"]["roles"][0]
    assert role["memory"] == "8GiB" and role["gpu"]["min_memory"] == "16GiB"
