"""tokens through the API: when a token expires, and the last characters of its secret
that lists show (its hint); the digest of a job's spec as submitted (idempotency keys
reused with another spec are refused)

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('hint', sa.String(length=16), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('spec_digest', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('spec_digest')
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.drop_column('hint')
        batch_op.drop_column('expires_at')
