"""a job's revision: bumped by the database on every UPDATE of its row, whoever writes
it, so that the scheduling leader, which keeps the queue in memory, reads only the jobs
that changed since its last pass (service/warm.py)

A trigger, not the ORM: writes from any process, any statement and any tool are seen.
On SQLite a `batch_alter_table` of `jobs` rebuilds the table without its triggers: a
later migration that does so must create the trigger again (`create_trigger`).

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

_PG = ("""CREATE OR REPLACE FUNCTION jobs_bump_rev() RETURNS trigger AS $$
BEGIN
    NEW.rev := OLD.rev + 1;
    RETURN NEW;
END $$ LANGUAGE plpgsql""",
       "CREATE TRIGGER jobs_rev BEFORE UPDATE ON jobs FOR EACH ROW "
       "EXECUTE FUNCTION jobs_bump_rev()")

# recursive triggers are off in SQLite: the trigger's own UPDATE does not fire it again
_SQLITE = """
CREATE TRIGGER jobs_rev AFTER UPDATE ON jobs FOR EACH ROW WHEN NEW.rev = OLD.rev
BEGIN
    UPDATE jobs SET rev = OLD.rev + 1 WHERE id = NEW.id;
END
"""


def create_trigger() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in _PG:
            op.execute(statement)
    else:
        op.execute(_SQLITE)


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rev', sa.Integer(), server_default='0',
                                      nullable=False))
    create_trigger()


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_rev" + (
        " ON jobs" if op.get_bind().dialect.name == "postgresql" else ""))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS jobs_bump_rev()")
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('rev')
