"""users inside teams: a token may be a user's of its team, a job carries its user

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user', sa.String(length=200), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user', sa.String(length=200), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_user'), ['user'])


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_user'))
        batch_op.drop_column('user')
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.drop_column('user')
