"""per-job GPU accounting (job_usage, job_samples), grant times of allocations, the
idle-GPU policy's marks on jobs, and GPU counters beyond hard faults

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

GPU_COLUMNS = (
    ('uuid', sa.String(length=100)), ('energy_joules', sa.Float()),
    ('sm_active', sa.Float()), ('ecc_corrected_total', sa.BigInteger()),
    ('nvlink_errors_total', sa.BigInteger()), ('thermal_throttle', sa.Boolean()),
    ('ecc_rose_at', sa.DateTime(timezone=True)), ('nvlink_rose_at', sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        for name, kind in GPU_COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idle_since', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('idle_flagged_at', sa.DateTime(timezone=True),
                                      nullable=True))
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('granted_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('released_at', sa.DateTime(timezone=True),
                                      nullable=True))
    op.create_table(
        'job_usage',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('job_id', sa.String(length=36), nullable=False),
        sa.Column('team', sa.String(length=200), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('role', sa.String(length=200), nullable=False),
        sa.Column('replica', sa.Integer(), nullable=False),
        sa.Column('host', sa.String(length=200), nullable=False),
        sa.Column('gpu', sa.Integer(), nullable=False),
        sa.Column('day', sa.String(length=10), nullable=False),
        sa.Column('sampled_seconds', sa.Float(), nullable=False),
        sa.Column('util_seconds', sa.Float(), nullable=False),
        sa.Column('util_peak', sa.Float(), nullable=True),
        sa.Column('memory_peak_bytes', sa.BigInteger(), nullable=True),
        sa.Column('energy_joules', sa.Float(), nullable=False),
        sa.Column('zero_seconds', sa.Float(), nullable=False),
        sa.Column('below_since', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_util', sa.Float(), nullable=True),
        sa.Column('last_power', sa.Float(), nullable=True),
        sa.Column('last_energy', sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('job_id', 'attempt', 'host', 'gpu', 'day', name='uq_job_usage'),
    )
    with op.batch_alter_table('job_usage', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_usage_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_usage_team'), ['team'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_usage_day'), ['day'], unique=False)
    op.create_table(
        'job_samples',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('job_id', sa.String(length=36), nullable=False),
        sa.Column('host', sa.String(length=200), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=False),
        sa.Column('utilization_gpu', sa.Float(), nullable=True),
        sa.Column('memory_used_bytes', sa.BigInteger(), nullable=True),
        sa.Column('power_watts', sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('job_samples', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_samples_job_id'), ['job_id'], unique=False)


def downgrade() -> None:
    op.drop_table('job_samples')
    op.drop_table('job_usage')
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_column('released_at')
        batch_op.drop_column('granted_at')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('idle_flagged_at')
        batch_op.drop_column('idle_since')
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        for name, _ in reversed(GPU_COLUMNS):
            batch_op.drop_column(name)
