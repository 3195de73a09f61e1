"""a launcher's heartbeat keeps the job's revision: an UPDATE that sets `rev` to -1 (QUIET,
service/common.py) changes only what the scheduling leader does not read (the lease), so
the row's revision stays and the leader does not read the row again. Every other UPDATE
still bumps it, whoever writes it.

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

_PG = """CREATE OR REPLACE FUNCTION jobs_bump_rev() RETURNS trigger AS $$
BEGIN
    IF NEW.rev = -1 THEN
        NEW.rev := OLD.rev;
    ELSE
        NEW.rev := OLD.rev + 1;
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql"""

_PG_DOWN = """CREATE OR REPLACE FUNCTION jobs_bump_rev() RETURNS trigger AS $$
BEGIN
    NEW.rev := OLD.rev + 1;
    RETURN NEW;
END $$ LANGUAGE plpgsql"""

# recursive triggers are off in SQLite: a trigger's own UPDATE fires no trigger
_SQLITE_QUIET = """
CREATE TRIGGER jobs_rev_quiet AFTER UPDATE ON jobs FOR EACH ROW WHEN NEW.rev = -1
BEGIN
    UPDATE jobs SET rev = OLD.rev WHERE id = NEW.id;
END
"""


def create_trigger() -> None:
    """The quiet write's trigger (on SQLite, beside 0020's jobs_rev, which does not fire
    for it: its rev changed); a later migration that rebuilds `jobs` on SQLite calls both."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG)
    else:
        op.execute(_SQLITE_QUIET)


def upgrade() -> None:
    create_trigger()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_DOWN)
    else:
        op.execute("DROP TRIGGER IF EXISTS jobs_rev_quiet")
