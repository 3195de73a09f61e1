"""MIG devices: what each replica holds (allocations.mig) and one hold row per device, so
the database refuses a MIG device granted twice as it does a GPU or a core

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('mig', sa.JSON(), nullable=True))
    op.create_table(
        'mig_holds',
        sa.Column('host', sa.String(length=200), nullable=False),
        sa.Column('gpu', sa.Integer(), nullable=False),
        sa.Column('device', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.String(length=36), nullable=False),
        sa.ForeignKeyConstraint(['host'], ['hosts.name']),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id']),
        sa.PrimaryKeyConstraint('host', 'gpu', 'device'))
    with op.batch_alter_table('mig_holds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_mig_holds_job_id'), ['job_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('mig_holds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_mig_holds_job_id'))
    op.drop_table('mig_holds')
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_column('mig')
