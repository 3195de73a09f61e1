"""reservations deleted after their start, kept for accounting (`acct --by reservation`)

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'deleted_reservations',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('hosts', sa.JSON(), nullable=False),
        sa.Column('teams', sa.JSON(), nullable=False),
        sa.Column('maint', sa.Boolean(), nullable=False),
        sa.Column('start_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('end_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('deleted_by', sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint('id'))
    with op.batch_alter_table('deleted_reservations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deleted_reservations_start_at'), ['start_at'])
        batch_op.create_index(batch_op.f('ix_deleted_reservations_end_at'), ['end_at'])


def downgrade() -> None:
    with op.batch_alter_table('deleted_reservations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_deleted_reservations_end_at'))
        batch_op.drop_index(batch_op.f('ix_deleted_reservations_start_at'))
    op.drop_table('deleted_reservations')
