"""notifications: a job's `notify` (webhook URL and events), a team's webhook and the
secret its notifications are signed with (`team_webhooks`), and the outbox of webhook
deliveries (`notifications`, indexed by what the delivery thread polls)

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('notify', sa.JSON(none_as_null=True), nullable=True))
    op.create_table(
        'team_webhooks',
        sa.Column('team', sa.String(length=200), nullable=False),
        sa.Column('url', sa.String(length=2000), nullable=True),
        sa.Column('events', sa.JSON(), nullable=True),
        sa.Column('secret', sa.String(length=100), nullable=True),
        sa.Column('secret_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('team'),
    )
    op.create_table(
        'notifications',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('delivery_id', sa.String(length=36), nullable=False),
        sa.Column('event_id', sa.Integer(), nullable=True),
        sa.Column('job_id', sa.String(length=36), nullable=True),
        sa.Column('team', sa.String(length=200), nullable=False),
        sa.Column('url', sa.String(length=2000), nullable=False),
        sa.Column('kind', sa.String(length=20), nullable=False),
        sa.Column('source', sa.String(length=10), nullable=False),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('state', sa.String(length=12), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('delivery_id'),
    )
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.create_index('ix_notifications_due', ['state', 'url', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_job_id'), ['job_id'],
                              unique=False)


def downgrade() -> None:
    op.drop_table('notifications')
    op.drop_table('team_webhooks')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('notify')
