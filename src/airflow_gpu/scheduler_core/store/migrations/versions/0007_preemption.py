"""preemption: who stopped a job and why, until when it may take to stop, the jobs that
ever preempted it (never preempted back by them), borrowed quota, why it was requeued; a
team's borrowing limit set by an admin

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('preempted_by', sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column('preempt_reason', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('preempt_deadline_at', sa.DateTime(timezone=True),
                                      nullable=True))
        batch_op.add_column(sa.Column('preempt_signal', sa.String(length=10), nullable=True))
        batch_op.add_column(sa.Column('preempt_grace', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('preemptors', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('borrowed', sa.Boolean(), nullable=False,
                                      server_default=sa.false()))
        batch_op.add_column(sa.Column('requeue_reason', sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column('preemptions', sa.Integer(), nullable=False,
                                      server_default='0'))


    with op.batch_alter_table('teams', schema=None) as batch_op:
        batch_op.add_column(sa.Column('borrow_gpus', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('teams', schema=None) as batch_op:
        batch_op.drop_column('borrow_gpus')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        for column in ('preemptions', 'requeue_reason', 'borrowed', 'preemptors',
                       'preempt_grace', 'preempt_signal', 'preempt_deadline_at', 'preempt_reason',
                       'preempted_by'):
            batch_op.drop_column(column)
