"""where each job row last changed: `changed`, set by the database on every INSERT and on
every UPDATE that bumps the revision, so that a scheduling pass reads only the rows
changed since its last read (an index on it) instead of the revisions of every pending
and live job (58,000 rows at 50,000 pending: about half of a pass).

PostgreSQL: the writing transaction's id (`txid_current()`); a reader that keeps the
oldest transaction its snapshot did not see (`txid_snapshot_xmin`) reads next every row
with `changed` at or above it: a transaction still running or not begun then, however
it commits later. SQLite (one writer at a time, committing in order): one more than the
highest mark so far.

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

_PG = ("""CREATE OR REPLACE FUNCTION jobs_bump_rev() RETURNS trigger AS $$
BEGIN
    IF NEW.rev = -1 THEN
        NEW.rev := OLD.rev;
    ELSE
        NEW.rev := OLD.rev + 1;
        NEW.changed := txid_current();
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql""",
       """CREATE OR REPLACE FUNCTION jobs_mark_insert() RETURNS trigger AS $$
BEGIN
    NEW.changed := txid_current();
    RETURN NEW;
END $$ LANGUAGE plpgsql""",
       "CREATE TRIGGER jobs_changed BEFORE INSERT ON jobs FOR EACH ROW "
       "EXECUTE FUNCTION jobs_mark_insert()")

_PG_DOWN = ("DROP TRIGGER IF EXISTS jobs_changed ON jobs",
            "DROP FUNCTION IF EXISTS jobs_mark_insert()",
            """CREATE OR REPLACE FUNCTION jobs_bump_rev() RETURNS trigger AS $$
BEGIN
    IF NEW.rev = -1 THEN
        NEW.rev := OLD.rev;
    ELSE
        NEW.rev := OLD.rev + 1;
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql""")

# 0020's jobs_rev, marking the row too; it fires for a statement that changes neither
# `rev` nor `changed` (the triggers' own UPDATEs change one of them: no trigger follows)
_SQLITE = ("DROP TRIGGER IF EXISTS jobs_rev", """
CREATE TRIGGER jobs_rev AFTER UPDATE ON jobs FOR EACH ROW
WHEN NEW.rev = OLD.rev AND NEW.changed = OLD.changed
BEGIN
    UPDATE jobs SET rev = OLD.rev + 1,
                    changed = (SELECT MAX(changed) FROM jobs) + 1 WHERE id = NEW.id;
END
""", """
CREATE TRIGGER jobs_changed AFTER INSERT ON jobs FOR EACH ROW
BEGIN
    UPDATE jobs SET changed = (SELECT MAX(changed) FROM jobs) + 1 WHERE id = NEW.id;
END
""")

# the rebuild of `jobs` that drops the column drops its triggers: 0020's and 0021's again
_SQLITE_DOWN = ("""
CREATE TRIGGER jobs_rev AFTER UPDATE ON jobs FOR EACH ROW WHEN NEW.rev = OLD.rev
BEGIN
    UPDATE jobs SET rev = OLD.rev + 1 WHERE id = NEW.id;
END
""", """
CREATE TRIGGER jobs_rev_quiet AFTER UPDATE ON jobs FOR EACH ROW WHEN NEW.rev = -1
BEGIN
    UPDATE jobs SET rev = OLD.rev WHERE id = NEW.id;
END
""")


def create_trigger() -> None:
    """The triggers (on SQLite, with 0021's create_trigger, after a rebuild of `jobs`)."""
    for statement in _PG if op.get_bind().dialect.name == "postgresql" else _SQLITE:
        op.execute(statement)


def upgrade() -> None:
    op.add_column('jobs', sa.Column('changed', sa.BigInteger(), server_default='0',
                                    nullable=False))
    op.create_index('ix_jobs_changed', 'jobs', ['changed'])
    create_trigger()


def downgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    for statement in _PG_DOWN if pg else ("DROP TRIGGER IF EXISTS jobs_changed",
                                          "DROP TRIGGER IF EXISTS jobs_rev"):
        op.execute(statement)
    op.drop_index('ix_jobs_changed', table_name='jobs')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('changed')
    if not pg:
        op.execute("DROP TRIGGER IF EXISTS jobs_rev_quiet")    # if the rebuild kept it
        for statement in _SQLITE_DOWN:
            op.execute(statement)
