"""initial schema

Revision ID: 0001
Revises: (none)
"""

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=True),
    sa.Column('host', sa.String(length=200), nullable=True),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_at'), ['at'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_job_id'), ['job_id'], unique=False)

    op.create_table('hosts',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('rack', sa.String(length=200), nullable=False),
    sa.Column('switch', sa.String(length=200), nullable=False),
    sa.Column('docker_url', sa.String(length=1000), nullable=True),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('drained', sa.Boolean(), nullable=False),
    sa.Column('reported_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('jobs',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('team', sa.String(length=200), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('reason_code', sa.String(length=40), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('eta_at', sa.Float(), nullable=True),
    sa.Column('submitted_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('admitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.String(length=20), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('team', 'idempotency_key', name='uq_jobs_team_key')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_state'), ['state'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_team'), ['team'], unique=False)

    op.create_table('teams',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('share', sa.Float(), nullable=True),
    sa.Column('quota_gpus', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('tokens',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('team', sa.String(length=200), nullable=False),
    sa.Column('admin', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('allocations',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.Column('role', sa.String(length=200), nullable=False),
    sa.Column('replica', sa.Integer(), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('gpus', sa.JSON(), nullable=False),
    sa.Column('cpus', sa.JSON(), nullable=False),
    sa.Column('memory_by_numa', sa.JSON(), nullable=False),
    sa.Column('nics', sa.JSON(), nullable=False),
    sa.Column('live', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['host'], ['hosts.name'], ),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_allocations_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_allocations_live'), ['live'], unique=False)

    op.create_table('cpu_holds',
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('cpu', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.ForeignKeyConstraint(['host'], ['hosts.name'], ),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('host', 'cpu')
    )
    with op.batch_alter_table('cpu_holds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_cpu_holds_job_id'), ['job_id'], unique=False)

    op.create_table('gpu_holds',
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('gpu', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.ForeignKeyConstraint(['host'], ['hosts.name'], ),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('host', 'gpu')
    )
    with op.batch_alter_table('gpu_holds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gpu_holds_job_id'), ['job_id'], unique=False)

    op.create_table('gpus',
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('memory_bytes', sa.BigInteger(), nullable=False),
    sa.Column('numa_node', sa.Integer(), nullable=False),
    sa.Column('healthy', sa.Boolean(), nullable=False),
    sa.Column('health_reason', sa.Text(), nullable=True),
    sa.Column('reported_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['host'], ['hosts.name'], ),
    sa.PrimaryKeyConstraint('host', 'index')
    )


def downgrade() -> None:
    op.drop_table('gpus')
    with op.batch_alter_table('gpu_holds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gpu_holds_job_id'))

    op.drop_table('gpu_holds')
    with op.batch_alter_table('cpu_holds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_cpu_holds_job_id'))

    op.drop_table('cpu_holds')
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_allocations_live'))
        batch_op.drop_index(batch_op.f('ix_allocations_job_id'))

    op.drop_table('allocations')
    op.drop_table('tokens')
    op.drop_table('teams')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_team'))
        batch_op.drop_index(batch_op.f('ix_jobs_state'))

    op.drop_table('jobs')
    op.drop_table('hosts')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_job_id'))
        batch_op.drop_index(batch_op.f('ix_events_at'))

    op.drop_table('events')
