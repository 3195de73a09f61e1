"""grant time indexes: accounting reports read the allocations whose grant overlaps
their window (granted before its end, released after its start), not every grant ever
made

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_allocations_granted_at'), ['granted_at'],
                              unique=False)
        batch_op.create_index(batch_op.f('ix_allocations_released_at'), ['released_at'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_allocations_released_at'))
        batch_op.drop_index(batch_op.f('ix_allocations_granted_at'))
