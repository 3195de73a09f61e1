"""node agent: registered topologies, GPU utilization, GPU faults of jobs

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('address', sa.String(length=1000), nullable=True))
        batch_op.add_column(sa.Column('registered_at', sa.DateTime(timezone=True),
                                      nullable=True))
        batch_op.add_column(sa.Column('topology', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('topology_hash', sa.String(length=64), nullable=True))
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.add_column(sa.Column('utilization_gpu', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('utilization_memory', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('memory_used_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('power_watts', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('temperature_c', sa.Float(), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gpu_fault', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('gpu_fault_at', sa.DateTime(timezone=True),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('gpu_fault_at')
        batch_op.drop_column('gpu_fault')
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        for name in ('temperature_c', 'power_watts', 'memory_used_bytes',
                     'utilization_memory', 'utilization_gpu'):
            batch_op.drop_column(name)
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        for name in ('topology_hash', 'topology', 'registered_at', 'address'):
            batch_op.drop_column(name)
