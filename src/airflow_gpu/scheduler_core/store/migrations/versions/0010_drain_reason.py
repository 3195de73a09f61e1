"""why a host is drained, since when and by whom (airflow-gpu drain HOST --reason TEXT,
Slurm's scontrol update NodeName=... State=DRAIN Reason=...)

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('drain_reason', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('drained_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('drained_by', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.drop_column('drained_by')
        batch_op.drop_column('drained_at')
        batch_op.drop_column('drain_reason')
