"""time limits: when a live job is stopped, its grace, and a protected job's promise

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deadline_at', sa.DateTime(timezone=True),
                                      nullable=True))
        batch_op.add_column(sa.Column('stop_grace', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('limit_cut_by', sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column('promised_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        for column in ('promised_at', 'limit_cut_by', 'stop_grace', 'deadline_at'):
            batch_op.drop_column(column)
