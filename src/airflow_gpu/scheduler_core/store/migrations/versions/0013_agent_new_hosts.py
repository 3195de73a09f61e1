"""agent tokens: the names or patterns of the hosts outside the cluster file that a token
may add (`--allow-new-hosts`); tokens made before may add none

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('allow_new_hosts', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.drop_column('allow_new_hosts')
