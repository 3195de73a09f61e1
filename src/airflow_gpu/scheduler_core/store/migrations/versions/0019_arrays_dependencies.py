"""job arrays and dependencies: an element's array and index, what keeps a pending job
from the pass (`blocked`: a dependency, or its array's max_running), the arrays, and the
jobs each job waits for; indexes for what the pass and the finish path read

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('array_id', sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column('array_index', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('blocked', sa.String(length=20), nullable=True))
        batch_op.create_index('ix_jobs_state_blocked', ['state', 'blocked'], unique=False)
        batch_op.create_index('ix_jobs_array', ['array_id', 'state', 'blocked',
                                                'array_index'], unique=False)
    op.create_table(
        'job_arrays',
        sa.Column('id', sa.String(length=36), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('team', sa.String(length=200), nullable=False),
        sa.Column('indexes', sa.Text(), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('max_running', sa.Integer(), nullable=True),
        sa.Column('throttled', sa.Boolean(), nullable=False),
        sa.Column('submitted_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'))
    with op.batch_alter_table('job_arrays', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_arrays_name'), ['name'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_arrays_team'), ['team'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_arrays_throttled'), ['throttled'],
                              unique=False)
    op.create_table(
        'job_dependencies',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('owner', sa.String(length=36), nullable=False),
        sa.Column('kind', sa.String(length=12), nullable=False),
        sa.Column('target', sa.String(length=36), nullable=False),
        sa.Column('target_array', sa.Boolean(), nullable=False),
        sa.Column('open', sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint('id'))
    with op.batch_alter_table('job_dependencies', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_dependencies_owner'), ['owner'],
                              unique=False)
        batch_op.create_index(batch_op.f('ix_job_dependencies_target'), ['target'],
                              unique=False)
        batch_op.create_index(batch_op.f('ix_job_dependencies_open'), ['open'],
                              unique=False)


def downgrade() -> None:
    op.drop_table('job_dependencies')
    op.drop_table('job_arrays')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_array')
        batch_op.drop_index('ix_jobs_state_blocked')
        batch_op.drop_column('blocked')
        batch_op.drop_column('array_index')
        batch_op.drop_column('array_id')
