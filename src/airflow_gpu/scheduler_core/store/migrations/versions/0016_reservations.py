"""admins' reservations of whole hosts for a window of time (maintenance, or teams'):
the reservations table, the reservation a job asks for and the one it yields to

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'reservations',
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('hosts', sa.JSON(), nullable=False),
        sa.Column('start_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('end_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('teams', sa.JSON(), nullable=False),
        sa.Column('maint', sa.Boolean(), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=True),
        sa.Column('gpu_model', sa.String(length=200), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_by', sa.String(length=200), nullable=False),
        sa.Column('drained', sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint('name'))
    with op.batch_alter_table('reservations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_reservations_start_at'), ['start_at'])
        batch_op.create_index(batch_op.f('ix_reservations_end_at'), ['end_at'])
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reservation', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('yield_reservation', sa.String(length=200),
                                      nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_reservation'), ['reservation'])


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_reservation'))
        batch_op.drop_column('yield_reservation')
        batch_op.drop_column('reservation')
    with op.batch_alter_table('reservations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_reservations_end_at'))
        batch_op.drop_index(batch_op.f('ix_reservations_start_at'))
    op.drop_table('reservations')
