"""idle requeues: how often the idle-GPU policy requeued a job (held after
`idle.hold_after` of them) and since when a requeued idle job waits at the back of its
band (its age counts from then, not from its submit)

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idle_requeues', sa.Integer(), nullable=False,
                                      server_default='0'))
        batch_op.add_column(sa.Column('queued_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('queued_at')
        batch_op.drop_column('idle_requeues')
