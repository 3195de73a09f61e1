"""the leader's lease per deployment: holder, fencing token, expiry by the database's clock

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'leader_lease',
        sa.Column('deployment', sa.String(length=300), nullable=False),
        sa.Column('holder', sa.String(length=200), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=True),
        sa.Column('token', sa.BigInteger(), nullable=False),
        sa.Column('acquired_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('deployment'))


def downgrade() -> None:
    op.drop_table('leader_lease')
